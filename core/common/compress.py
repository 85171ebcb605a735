"""Compressors for artifacts, in one registry, and the byte shuffle that helps them.

Each compressor has a fixed id (the byte pgolf's container stores after its magic;
ids never change meaning, so old artifacts keep loading), a default level and the
levels it accepts. brotli and zstandard are imported only when used.

The byte shuffle is the challenge records' layout (2026-04-01): the header
b"BSHF" + one byte holding the stride, then the bytes at positions 0, s, 2s, ...,
then those at 1, 1+s, ..., and so on. With stride 2, the low bytes of every fp16
scale come together, and so do the high ones, which compress better. Data shorter
than the stride (or a stride below 2) is returned unchanged, without a header.

`pergroup` (its code in core/common/pergroup.py, which the container calls for it: core/artifact/container.py's
`pack_body`; this module checks that its lrzip program is installed) compresses pgolf's artifact
payload (a safetensors file) in the per-group layout: each group of int8 matrices with the `lrzip` program (`lrzip -z -L 9`, its
ZPAQ back end, one thread, no config file: the same bytes on every machine with the same lrzip), the
layout, row orders and rest with brotli-11, after the byte shuffle when one is asked. Its body:
a uint32 count of streams, their uint32 lengths, then the streams: the brotli one, then one per
group. Bytes that are not a safetensors file are all rest: brotli alone, no lrzip needed.

Decompression trusts nothing: the output may be at most MAX_OUTPUT_BYTES (a small file
that would inflate past it is refused as it is read), the data must end exactly where its
stream ends, and a stream cut short is refused.
"""

from __future__ import annotations

import bz2
import importlib
import lzma
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.common.errors import PgolfError, setting

__all__ = [
    "COMPRESSORS",
    "SHUFFLE_FLAG",
    "SHUFFLE_MAGIC",
    "Compressor",
    "byte_shuffle",
    "byte_unshuffle",
    "check_available",
    "compress",
    "compressor_by_id",
    "decompress",
    "id_byte",
    "lrzip_installed",
    "pack",
    "require_lrzip",
    "unpack",
]

SHUFFLE_MAGIC = b"BSHF"
SHUFFLE_FLAG = 0x80  # set in the container's id byte when the payload was byte-shuffled
MAX_OUTPUT_BYTES = 2**32  # the most any decompression may give (a record's int6 payload is ~30 MB)
PERGROUP = "pergroup"


def _package(compressor: str, package: str, version: str) -> Any:
    """The module of an optional compressor's package, or a PgolfError saying how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise PgolfError(
            f"the {compressor} compressor needs the {package} package: pip install '{package}>={version}'"
        ) from None


def _brotli() -> Any:
    return _package("brotli", "brotli", "1.1")


def _too_large(out: bytes, name: str) -> None:
    if len(out) > MAX_OUTPUT_BYTES:
        raise ValueError(f"{name} data decompresses to more than {MAX_OUTPUT_BYTES:,} bytes")


def _brotli_decompress(data: bytes) -> bytes:
    decoder = _brotli().Decompressor()
    try:
        out = decoder.process(data, output_buffer_limit=MAX_OUTPUT_BYTES + 1)
    except TypeError:  # brotli 1.1 has no output limit
        out = decoder.process(data)
    _too_large(out, "brotli")
    if not decoder.is_finished():
        raise ValueError("brotli data ends before the end of its stream")
    return out


# ------------------------------------------------- none, zlib, lzma, bz2 and zstd
def zstd_package() -> Any:
    """The zstandard package, or a PgolfError saying how to install it."""
    return _package("zstd", "zstandard", "0.22")


def _stream(name: str, make: Callable[[], Any]) -> Callable[[bytes], bytes]:
    """Decompression by a zlib/lzma/bz2-style decoder object: bounded, whole, nothing after the end."""

    def run(data: bytes) -> bytes:
        decoder = make()
        out = decoder.decompress(data, MAX_OUTPUT_BYTES + 1)
        _too_large(out, name)
        if not decoder.eof:
            raise ValueError(f"{name} data ends before the end of its stream")
        if decoder.unused_data:
            raise ValueError(f"bytes after the end of the {name} stream")
        return out

    return run


def _zstd_decompress(data: bytes) -> bytes:
    # Stream decoders: they do not trust (and allocate) the size a damaged frame header claims.
    zstd = zstd_package().ZstdDecompressor()
    with zstd.stream_reader(data, read_across_frames=False) as reader:
        _too_large(reader.read(MAX_OUTPUT_BYTES + 1), "zstd")
    decoder = zstd.decompressobj()
    out = decoder.decompress(data)
    if not decoder.eof:
        raise ValueError("zstd data ends before the end of its frame")
    if decoder.unused_data:
        raise ValueError("bytes after the end of the zstd frame")
    return out


def _none_decompress(data: bytes) -> bytes:
    _too_large(data, "uncompressed")
    return bytes(data)


# name: (compress(data, level), decompress(data))
CODECS: dict[str, tuple[Callable[[bytes, int | None], bytes], Callable[[bytes], bytes]]] = {
    "none": (lambda data, level: data, _none_decompress),
    "zlib": (lambda d, lv: zlib.compress(d, lv), _stream("zlib", zlib.decompressobj)),
    "lzma": (lambda d, lv: lzma.compress(d, preset=lv), _stream("lzma", lzma.LZMADecompressor)),
    "bz2": (lambda d, lv: bz2.compress(d, lv), _stream("bz2", bz2.BZ2Decompressor)),
    "zstd": (lambda d, lv: zstd_package().ZstdCompressor(level=lv).compress(d), _zstd_decompress),
}


@dataclass(frozen=True)
class Compressor:
    name: str
    id: int  # the container's id byte (without SHUFFLE_FLAG); never reused
    levels: range | None  # the levels it accepts, the last one its default; None: it has no levels


COMPRESSORS: dict[str, Compressor] = {
    c.name: c
    for c in (
        Compressor("none", 0, None),
        Compressor("zlib", 1, range(0, 10)),
        Compressor("lzma", 2, range(0, 10)),
        Compressor("bz2", 3, range(1, 10)),
        Compressor("brotli", 4, range(0, 12)),
        Compressor("zstd", 5, range(1, 23)),
        Compressor(PERGROUP, 6, None),
    )
}


def get(name: str) -> Compressor:
    if name not in COMPRESSORS:
        raise PgolfError(f"unknown compressor {name!r} (choose from {', '.join(COMPRESSORS)})")
    return COMPRESSORS[name]


def lrzip_installed() -> bool:
    return shutil.which("lrzip") is not None


def require_lrzip(doing: str, writing: bool = True) -> None:
    """Refuse in one line when the lrzip program is missing: how to install it, and, when `writing`,
    the compressors that need no program (a file already written needs lrzip to be read)."""
    if not lrzip_installed():
        other = f", or choose another compressor ({setting('compressor', 'brotli')})" if writing else ""
        raise PgolfError(
            f"{doing} needs the lrzip program, which is not installed: apt-get install lrzip (Debian, "
            f"Ubuntu) or brew install lrzip (macOS){other}"
        )


def check_available(name: str) -> None:
    """Refuse, in one line, a compressor this machine cannot run: its package or program is missing."""
    get(name)
    if name in ("brotli", PERGROUP):
        _brotli()
    if name == "zstd":
        zstd_package()
    if name == PERGROUP:
        require_lrzip("the pergroup compressor")


def compressor_by_id(code: int) -> Compressor:
    for c in COMPRESSORS.values():
        if c.id == code:
            return c
    raise ValueError(f"unknown compressor id {code}")


def resolve_level(name: str, level: int | None) -> int | None:
    """The level to use: the compressor's default when None; refused when out of range."""
    levels = get(name).levels
    if levels is None:
        return None
    level = levels[-1] if level is None else level
    if level not in levels:
        raise PgolfError(f"compressor {name}: level {level} is not in {levels.start}..{levels.stop - 1}")
    return level


def compress(data: bytes, name: str, level: int | None = None) -> bytes:
    """`data` compressed by compressor `name` (at its default level when None): `pack`'s bytes without the id byte."""
    return pack(data, name, level)[1:]


def decompress(data: bytes, name: str) -> bytes:
    """`compress`'s inverse, for every compressor but pergroup (core/common/pergroup.py: `unpack`)."""
    get(name)
    if name == "brotli":
        return _brotli_decompress(data)
    return CODECS[name][1](data)


# ---------------------------------------------------------------- byte shuffle
def byte_shuffle(data: bytes, stride: int = 2) -> bytes:
    """The records' shuffle: b"BSHF" + bytes([stride]) + byte planes (unchanged data if it cannot apply,
    as with stride 0: no shuffle)."""
    if stride <= 1 or len(data) < stride:
        return data
    if stride > 255:
        raise PgolfError(f"byte shuffle stride {stride} does not fit its one-byte header")
    src = np.frombuffer(data, dtype=np.uint8)
    planes = np.concatenate([src[pos::stride] for pos in range(stride)])
    return SHUFFLE_MAGIC + bytes([stride]) + planes.tobytes()


def byte_unshuffle(data: bytes, strict: bool = False) -> bytes:
    """Undo `byte_shuffle`. Data without the header is returned as is, unless `strict` (then refused)."""
    if len(data) < 5 or data[:4] != SHUFFLE_MAGIC:
        if strict:
            raise ValueError("the byte-shuffle header is missing")
        return data
    stride = data[4]
    if stride < 2:  # the records' reader drops the header and keeps the rest as it is
        if strict:
            raise ValueError(f"byte-shuffle stride {stride} (at least 2 expected)")
        return data[5:]
    src = np.frombuffer(data, dtype=np.uint8, offset=5)
    out = np.empty_like(src)
    start = 0
    for pos in range(stride):
        plane = out[pos::stride]  # a view: filling it fills `out`
        plane[:] = src[start : start + len(plane)]
        start += len(plane)
    return out.tobytes()


# ------------------------------------------------------- the container's body
def id_byte(payload: bytes, name: str, shuffle: int = 0) -> bytes:
    """The container body's first byte: the compressor's id, | SHUFFLE_FLAG when shuffled; a stride that
    cannot apply is refused."""
    get(name)
    if shuffle not in (0, *range(2, 256)):
        raise PgolfError(f"byte shuffle stride {shuffle}: use 0 (none) or 2..255")
    if shuffle and len(payload) < shuffle:
        raise PgolfError(f"byte shuffle stride {shuffle} is longer than the {len(payload)}-byte payload")
    return bytes([COMPRESSORS[name].id | (SHUFFLE_FLAG if shuffle else 0)])


def pack(payload: bytes, name: str = "zlib", level: int | None = None, shuffle: int = 0) -> bytes:
    """`id_byte` + the compressed payload, for every compressor but pergroup, whose body the container
    packs (core/artifact/container.py: `pack_body`). `shuffle` is the byte-shuffle stride (0 for none; 2 suits
    fp16 data)."""
    level = resolve_level(name, level)
    code = id_byte(payload, name, shuffle)
    if name == PERGROUP:
        raise ValueError("the pergroup compressor's body is packed by core/artifact/container.py: pack_body")
    data = byte_shuffle(payload, shuffle)
    if name == "brotli":
        return code + _brotli().compress(data, quality=level)
    return code + CODECS[name][0](data, level)


def unpack(blob: bytes) -> tuple[bytes, str, int]:
    """(payload, compressor name, shuffle stride) from `pack`'s bytes; ValueError when damaged."""
    if not blob:
        raise ValueError("the compressor id byte is missing")
    code = blob[0]
    c = compressor_by_id(code & ~SHUFFLE_FLAG)
    if c.name == PERGROUP:
        raise ValueError("the pergroup compressor's body is read by core/artifact/container.py: unpack_body")
    body = decompress(blob[1:], c.name)
    if not code & SHUFFLE_FLAG:
        return body, c.name, 0
    return byte_unshuffle(body, strict=True), c.name, body[4]
