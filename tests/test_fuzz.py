"""Fuzzing every file pgolf reads: artifacts of each format, checkpoints and shards.

Random byte changes (mostly where parsing happens) and truncations of a valid file, and
changes inside a pgolf container's payload compressed again (damage no compressor sees). pgolf's
containers keep a tokenizer's SHA-256 in their metadata, as a run's artifact does; the mixed ones
are fuzzed under every compressor, pergroup among them (lrzip, or a stand-in where it is missing).
Every outcome must be one of: a PgolfError naming the file in one line, or, for pgolf's
own artifacts and checkpoints, exactly the content that was written (their checksums
refuse anything else); for files with no checksum of their own (the challenge's and the
records' artifacts, shards), content that loads and dequantizes. No other exception, and
no read that takes longer than HANG_SECONDS.

Each test runs FUZZ_EXAMPLES cases (60 by default, seconds in all); for a longer search:

    PGOLF_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_fuzz.py
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.artifact import container, int8_format, mixed, upstream
from core.artifact.checkpoint import Checkpoint, save_checkpoint
from core.artifact.load import load_checkpoint, load_mixed_artifact
from core.common.errors import PgolfError
from core.data.shards import read_shard
from core.datasets.writers import write_shard
from tests.support.artifacts import FAKE_LRZIP, golden_state, quantize
from tests.support.backends import requires_torch
from tests.support.fuzz import FUZZ, HANG_SECONDS, run_within


def fuzz(data, blob: bytes, header_end: int) -> bytes:
    """1-4 random byte changes (mostly where parsing happens, before `header_end`), maybe a truncation."""
    blob = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, min(header_end, len(blob)) - 1) | st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    return bytes(blob[: data.draw(st.integers(0, len(blob)) | st.just(len(blob)))])


def fuzz_payload(data, blob: bytes) -> bytes:
    """A pgolf container whose payload has 1-4 bytes changed, compressed again, its checksum kept."""
    payload, compressor, shuffle = container.unpack_body(blob[len(container.MAGIC) : -container.DIGEST_BYTES])
    payload = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, min(2000, len(payload)) - 1) | st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    return (
        container.MAGIC
        + container.pack_body(bytes(payload), compressor, shuffle=shuffle)
        + blob[-container.DIGEST_BYTES :]
    )


def read_back(load, path: Path, blob: bytes):
    """What load(path) gives for a file holding `blob`, or None when it refused it as it must:
    a PgolfError of one line naming the file. Anything else, or a hang, fails the test."""
    path.write_bytes(blob)
    value, error = run_within(HANG_SECONDS, lambda: load(path))
    if error is None:
        return value
    if not isinstance(error, PgolfError):
        raise error
    assert path.name in str(error) and "\n" not in str(error), str(error)
    return None


# The SHA-256 of a tokenizer, which pgolf's artifacts keep in their metadata.
TOKENIZER = "5f" * 32


# ------------------------------------------------------------ pgolf's int8 container
INT8_KINDS = {"none": ("none", 0), "zlib": ("zlib", 0), "bz2": ("bz2", 0), "zstd": ("zstd", 0),
              "brotli+shuffle": ("brotli", 2)}  # fmt: skip


@pytest.fixture(scope="module")
def int8_blobs() -> dict[str, bytes]:
    model = quantize(*golden_state())
    return {
        k: int8_format.artifact_bytes(model, compressor=c, shuffle=s, tokenizer=TOKENIZER)
        for k, (c, s) in INT8_KINDS.items()
    }


def check_int8(path: Path, blob: bytes, original: bytes, kind: str) -> None:
    model = read_back(upstream.load_artifact, path, blob)
    if model is not None:  # accepted: it must be exactly what was written
        compressor, shuffle = INT8_KINDS[kind]
        written = int8_format.artifact_bytes(
            model, compressor=compressor, shuffle=shuffle, tokenizer=model.tokenizer_sha256
        )
        assert written == original


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(INT8_KINDS)))
def test_int8_artifacts(tmp_path, int8_blobs, data, kind):
    original = int8_blobs[kind]
    check_int8(
        tmp_path / "fuzz.pgolf", fuzz(data, original, len(container.MAGIC) + 1 + 8 + 600), original, kind
    )


@pytest.mark.slow
@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(INT8_KINDS)))
def test_int8_artifacts_changed_inside_their_payload(tmp_path, int8_blobs, data, kind):
    original = int8_blobs[kind]
    check_int8(tmp_path / "fuzz.pgolf", fuzz_payload(data, original), original, kind)


# ------------------------------------------------------ pgolf's mixed-precision container
MIXED_KINDS = {"none": ("none", 0), "zlib+shuffle": ("zlib", 2), "zstd": ("zstd", 0),
               "brotli+shuffle": ("brotli", 2), "pergroup": ("pergroup", 0)}  # fmt: skip


@pytest.fixture(scope="module")
def lrzip_on_path(tmp_path_factory):
    """The lrzip program for pergroup's groups: the installed one, else a stand-in that only frames the
    bytes (tests/support/artifacts.py: FAKE_LRZIP), so that damage reaches pgolf's own checks."""
    if shutil.which("lrzip") is not None:
        yield
        return

    folder = tmp_path_factory.mktemp("bin")
    (folder / "lrzip").write_text(FAKE_LRZIP.format(python=sys.executable))
    (folder / "lrzip").chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        patch.setenv("FAKE_LRZIP", "")
        yield


@pytest.fixture(scope="module")
def mixed_blobs(lrzip_on_path) -> dict[str, bytes]:
    state, dtypes = golden_state()
    classes = {"tok_emb.weight": "embedding", "blocks.0.mlp.fc.weight": "mlp", "blocks.0.attn.q_gain": "control",
               "extra.cube": "other", "extra.bias": "other", "extra.step": "other"}  # fmt: skip
    model = mixed.quantize_mixed(state, classes, bits={"mlp": 5}, orig_dtypes=dtypes)
    return {
        k: mixed.mixed_artifact_bytes(model, c, shuffle=s, tokenizer=TOKENIZER)
        for k, (c, s) in MIXED_KINDS.items()
    }


def check_mixed(path: Path, blob: bytes, original: bytes, kind: str) -> None:
    model = read_back(load_mixed_artifact, path, blob)
    if model is not None:
        compressor, shuffle = MIXED_KINDS[kind]
        written = mixed.mixed_artifact_bytes(
            model, compressor, shuffle=shuffle, tokenizer=model.tokenizer_sha256
        )
        assert written == original


@pytest.mark.slow
@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(MIXED_KINDS)))
def test_mixed_artifacts(tmp_path, mixed_blobs, data, kind):
    original = mixed_blobs[kind]
    check_mixed(
        tmp_path / "fuzz.pgolf", fuzz(data, original, len(container.MAGIC) + 1 + 8 + 1200), original, kind
    )


@pytest.mark.slow
@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(MIXED_KINDS)))
def test_mixed_artifacts_changed_inside_their_payload(tmp_path, mixed_blobs, data, kind):
    original = mixed_blobs[kind]
    check_mixed(tmp_path / "fuzz.pgolf", fuzz_payload(data, original), original, kind)


@pytest.mark.parametrize("kind", sorted(MIXED_KINDS))
def test_truncated_mixed_artifacts(tmp_path, mixed_blobs, kind):
    blob = mixed_blobs[kind]
    for cut in (0, len(container.MAGIC), len(container.MAGIC) + 1, 40, len(blob) // 2, len(blob) - 1):
        assert read_back(load_mixed_artifact, tmp_path / "a.pgolf", blob[:cut]) is None


# ------------------------------------------- the challenge's and the records' artifacts
@pytest.mark.torch
@requires_torch
@FUZZ
@given(data=st.data())
def test_upstream_int8_artifacts(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "upstream.ptz"
    if not path.exists():
        upstream.save_upstream_torch(path, quantize(*golden_state()))
    model = read_back(upstream.load_artifact, path.with_name("fuzz.ptz"), fuzz(data, path.read_bytes(), 2000))
    if model is not None:  # no checksum of its own: it must at least dequantize
        int8_format.dequantize_int8(model)


@pytest.mark.torch
@requires_torch
@FUZZ
@given(data=st.data())
def test_record_artifacts(tmp_path, data):
    from core.artifact.records import load_record_artifact
    from tests.golden_data import RECORD_PTZ

    model = read_back(load_record_artifact, tmp_path / "fuzz.ptz", fuzz(data, RECORD_PTZ.read_bytes(), 2000))
    if model is not None:
        mixed.dequantize_mixed(model)


# ------------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def checkpoint_blob(tmp_path_factory) -> tuple[bytes, Checkpoint]:
    rng = np.random.default_rng(0)
    ckpt = Checkpoint(
        params={
            "tok_emb.weight": rng.normal(size=(16, 8)).astype(np.float32),
            "skip_weights": np.ones((2, 8), np.float32),
        },
        optimizer={"step": np.array(5, np.int64), "exp_avg/skip_weights": np.zeros((2, 8), np.float32)},
        config={"seed": 1337, "matrix_lr": 0.04},
        step=5,
        train_time_ms=1234.5,
        data_state={"file_index": 0, "position": 99, "epoch": 1},
        backend="cuda",
        dtypes={"tok_emb.weight": "float32", "skip_weights": "float32"},
    )
    path = save_checkpoint(tmp_path_factory.mktemp("ckpt") / "c.safetensors", ckpt)
    return path.read_bytes(), ckpt


@FUZZ
@given(data=st.data())
def test_checkpoints(tmp_path, checkpoint_blob, data):
    blob, written = checkpoint_blob
    back = read_back(load_checkpoint, tmp_path / "fuzz.safetensors", fuzz(data, blob, 1200))
    if back is not None:  # accepted: every tensor and every field as written
        for part in ("params", "optimizer"):
            a, b = getattr(back, part), getattr(written, part)
            assert a.keys() == b.keys() and all(
                a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a
            )
        fields = ("config", "step", "train_time_ms", "data_state", "backend", "dtypes")
        assert [getattr(back, f) for f in fields] == [getattr(written, f) for f in fields]


# ----------------------------------------------------------------------------- shards
@FUZZ
@given(data=st.data())
def test_shards(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "fineweb_val_000000.bin"
    if not path.exists():
        write_shard(path, np.arange(3000) % 1024)
    tokens = read_back(
        lambda p: read_shard(p, vocab_size=1024),
        path.with_name("fuzz.bin"),
        fuzz(data, path.read_bytes(), 16),
    )
    if tokens is not None:  # no checksum: whatever loads is tokens of the vocabulary
        assert tokens.dtype == np.uint16 and (tokens.size == 0 or int(tokens.max()) < 1024)
