"""Compressors, the byte shuffle (against the record's own output), and the container's id byte."""

from __future__ import annotations

import bz2
import lzma
import zlib

import brotli
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from core.artifact import container, int8_format, upstream
from core.common import compress
from core.common.errors import PgolfError
from tests.golden_data import goldens
from tests.support.artifacts import equal_weights, golden_state

SAMPLE = np.random.default_rng(0).normal(0, 0.02, 5000).astype(np.float16).tobytes() + b"tail"


# What old artifacts hold: each compressor's id byte (0-3 from the int8-only days), and how each
# body was made, with the library's own call at pgolf's levels.
IDS = {"none": 0, "zlib": 1, "lzma": 2, "bz2": 3, "brotli": 4, "zstd": 5, "pergroup": 6}
STANDARD = {
    "none": lambda d: d,
    "zlib": lambda d: zlib.compress(d, 9),
    "lzma": lambda d: lzma.compress(d, preset=9),
    "bz2": lambda d: bz2.compress(d, 9),
    "brotli": lambda d: brotli.compress(d, quality=11),
    "zstd": lambda d: zstandard.ZstdCompressor(level=22).compress(d),
}


def test_ids_never_change_meaning():
    """The id bytes are fixed, distinct and below the shuffle flag, in the codec and the container."""
    assert {n: c.id for n, c in compress.COMPRESSORS.items()} == IDS
    assert len(set(IDS.values())) == len(IDS)
    assert compress.SHUFFLE_FLAG == 0x80 and max(IDS.values()) < compress.SHUFFLE_FLAG
    assert {i: compress.compressor_by_id(i).name for i in IDS.values()} == {i: n for n, i in IDS.items()}


@pytest.mark.parametrize("name", list(STANDARD))
def test_a_body_made_without_pgolf_is_read_by_its_id(name):
    """A body as an old artifact holds it (its id byte, then the library's own output) comes back."""
    assert compress.unpack(bytes([IDS[name]]) + STANDARD[name](SAMPLE)) == (SAMPLE, name, 0)
    shuffled = bytes([IDS[name] | 0x80]) + STANDARD[name](compress.byte_shuffle(SAMPLE, 2))
    assert compress.unpack(shuffled) == (SAMPLE, name, 2)


@pytest.mark.parametrize("name", [n for n in STANDARD if n != "none"])
def test_defaults_are_the_records_settings(name):
    """brotli at quality 11 and zstd at level 22 (the records'); the others at 9, as pgolf always did."""
    assert compress.compress(SAMPLE, name) == STANDARD[name](SAMPLE)
    assert compress.decompress(STANDARD[name](SAMPLE), name) == SAMPLE


@pytest.mark.parametrize("name", list(compress.COMPRESSORS))
@pytest.mark.parametrize("shuffle", [0, 2, 3])
def test_pack_round_trips(name, shuffle):
    """The container's body (pergroup's streams are the container's to pack: core/artifact/container.py)."""
    blob = container.pack_body(SAMPLE, name, shuffle=shuffle)
    assert blob[0] == compress.COMPRESSORS[name].id | (compress.SHUFFLE_FLAG if shuffle else 0)
    assert container.unpack_body(blob) == (SAMPLE, name, shuffle)
    if name == compress.PERGROUP:
        with pytest.raises(ValueError, match="pack_body"):
            compress.pack(SAMPLE, name)
        with pytest.raises(ValueError, match="unpack_body"):
            compress.unpack(blob)
    else:
        assert compress.pack(SAMPLE, name, shuffle=shuffle) == blob


def test_shuffle_helps_fp16_data():
    plain = len(compress.pack(SAMPLE, "brotli", level=5))
    assert len(compress.pack(SAMPLE, "brotli", level=5, shuffle=2)) < plain


def test_byte_shuffle_is_the_records_bytes():
    tensors, _ = goldens()
    data = tensors["shuffle/data"].tobytes()
    for stride in (2, 3, 4):
        expected = tensors[f"shuffle/s{stride}"].tobytes()
        assert expected[:5] == b"BSHF" + bytes([stride])
        assert compress.byte_shuffle(data, stride) == expected
        assert compress.byte_unshuffle(expected) == data


def test_byte_shuffle_edge_cases_follow_the_record():
    assert compress.byte_shuffle(b"a", 2) == b"a"  # shorter than the stride: unchanged, no header
    assert compress.byte_shuffle(b"abcdef", 1) == b"abcdef"
    assert compress.byte_shuffle(b"abcdef", 2) == b"BSHF\x02ace" + b"bdf"
    assert compress.byte_unshuffle(b"plain bytes") == b"plain bytes"  # no header: as it is
    assert compress.byte_unshuffle(b"BSHF\x01rest") == b"rest"
    with pytest.raises(ValueError, match="header is missing"):
        compress.byte_unshuffle(b"plain bytes", strict=True)
    with pytest.raises(PgolfError, match="stride 300"):
        compress.byte_shuffle(b"x" * 400, 300)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), stride=st.integers(2, 9))
def test_byte_unshuffle_inverts_byte_shuffle(data, stride):
    assert compress.byte_unshuffle(compress.byte_shuffle(data, stride)) == data


def test_bad_settings_are_refused():
    with pytest.raises(PgolfError, match="unknown compressor 'lz4'"):
        compress.pack(b"x", "lz4")
    with pytest.raises(PgolfError, match=r"brotli: level 12 is not in 0..11"):
        compress.pack(b"x", "brotli", level=12)
    with pytest.raises(PgolfError, match=r"zstd: level 0 is not in 1..22"):
        compress.pack(b"x", "zstd", level=0)
    with pytest.raises(PgolfError, match="stride 1"):
        compress.pack(b"xyz", "zlib", shuffle=1)
    with pytest.raises(PgolfError, match="longer than the 3-byte payload"):
        compress.pack(b"xyz", "zlib", shuffle=4)


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "id byte is missing"),
        (b"\x09abc", "unknown compressor id 9"),
        (bytes([4 | 0x80]) + brotli.compress(b"no header here"), "header is missing"),
        (b"\x05" + zstandard.ZstdCompressor().compress(SAMPLE)[:-3], "ends before the end of its frame"),
        (b"\x05" + zstandard.ZstdCompressor().compress(b"abc") + b"junk", "bytes after the end"),
    ],
)
def test_damaged_bodies_raise_value_errors(blob, reason):
    with pytest.raises(ValueError, match=reason):
        compress.unpack(blob)


def test_missing_packages_are_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "brotli", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(PgolfError, match=r"pip install 'brotli"):
        compress.pack(b"x", "brotli")
    with pytest.raises(PgolfError, match=r"pip install 'zstandard"):
        compress.decompress(b"x", "zstd")


@pytest.mark.parametrize(("name", "shuffle"), [("brotli", 2), ("zstd", 0), ("lzma", 2), ("zlib", 4)])
def test_the_int8_container_takes_every_compressor(tmp_path, name, shuffle):
    model = int8_format.quantize_int8(*golden_state())
    info = container.write_artifact(
        tmp_path / "m.pgolf", int8_format.artifact_bytes(model, name, shuffle=shuffle), name
    )
    blob = info.path.read_bytes()
    assert blob[len(container.MAGIC)] == compress.COMPRESSORS[name].id | (0x80 if shuffle else 0)
    assert equal_weights(model, upstream.load_artifact(info.path))
