"""Compressors for artifacts, in one registry, and the byte shuffle that helps them.

Each compressor has a fixed id (the byte pgolf's container stores after its magic;
ids never change meaning, so old artifacts keep loading), a default level and the
levels it accepts. brotli and zstandard are imported only when used.

The byte shuffle is the challenge records' layout (2026-04-01): the header
b"BSHF" + one byte holding the stride, then the bytes at positions 0, s, 2s, ...,
then those at 1, 1+s, ..., and so on. With stride 2, the low bytes of every fp16
scale come together, and so do the high ones, which compress better. Data shorter
than the stride (or a stride below 2) is returned unchanged, without a header.

`pergroup` compresses pgolf's artifact payload (a safetensors file) in the per-group layout of
core/common/pergroup.py: each group of int8 matrices with the `lrzip` program (`lrzip -z -L 9`, its
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
import itertools
import lzma
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError, first_line, setting

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
    "lrzip_decompress",
    "lrzip_installed",
    "pack",
    "split_streams",
    "unpack",
]

SHUFFLE_MAGIC = b"BSHF"
SHUFFLE_FLAG = 0x80  # set in the container's id byte when the payload was byte-shuffled
MAX_OUTPUT_BYTES = 2**32  # the most any decompression may give (a record's int6 payload is ~30 MB)
PERGROUP = "pergroup"
# ZPAQ at level 9, one thread: lrzip splits its input by its thread count (by default the machine's CPUs).
LRZIP_ARGS = ("-z", "-L", "9", "-p", "1")


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


def _zstd() -> Any:
    return _package("zstd", "zstandard", "0.22")


def _too_large(out: bytes, name: str) -> None:
    if len(out) > MAX_OUTPUT_BYTES:
        raise ValueError(f"{name} data decompresses to more than {MAX_OUTPUT_BYTES:,} bytes")


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


def _zstd_decompress(data: bytes) -> bytes:
    # Stream decoders: they do not trust (and allocate) the size a damaged frame header claims.
    zstd = _zstd().ZstdDecompressor()
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


def lrzip_installed() -> bool:
    return shutil.which("lrzip") is not None


def _require_lrzip(doing: str, writing: bool = True) -> None:
    """Refuse in one line when the lrzip program is missing: how to install it, and, when `writing`,
    the compressors that need no program (a file already written needs lrzip to be read)."""
    if not lrzip_installed():
        other = f", or choose another compressor ({setting('compressor', 'brotli')})" if writing else ""
        raise PgolfError(
            f"{doing} needs the lrzip program, which is not installed: apt-get install lrzip (Debian, "
            f"Ubuntu) or brew install lrzip (macOS){other}"
        )


# An lrzip that has not finished by then is stopped: a hung program never hangs a command. ZPAQ at level 9
# runs at 0.1-1 MB/s on one core; the limit allows a 16 KB/s machine (a busy one) with room to spare.
LRZIP_TIMEOUT_S = 120.0
LRZIP_MIN_BYTES_PER_S = 16_000


def lrzip_timeout(nbytes: int) -> float:
    """Seconds one lrzip call on `nbytes` of uncompressed data may take."""
    return LRZIP_TIMEOUT_S + nbytes / LRZIP_MIN_BYTES_PER_S


def _lrzip(data: bytes, args: tuple[str, ...]) -> bytes:
    """`data` through the lrzip program (temp files in a folder of their own, removed after). A failure
    to decompress is ValueError (damaged data); to compress, PgolfError; a call past `lrzip_timeout`
    is stopped, a PgolfError."""
    size = _lrzip_size(data) if "-d" in args else len(data)
    limit = lrzip_timeout(min(size, 2**27))  # a damaged header cannot stretch it past ~2.5 h
    with tempfile.TemporaryDirectory(prefix="pgolf-lrzip-") as tmp:
        src, out = Path(tmp) / "in", Path(tmp) / "out"
        src.write_bytes(data)
        try:
            done = subprocess.run(
                ["lrzip", "-q", *args, "-o", out, src],
                capture_output=True,
                env={**os.environ, "LRZIP": "NOCONFIG"},  # no lrzip.conf changes the settings
                timeout=limit,
            )
        except subprocess.TimeoutExpired:  # subprocess.run has killed it
            raise PgolfError(
                f"lrzip {' '.join(args)} did not finish within {limit:.0f} s on {size:,} bytes: stopped"
            ) from None
        if done.returncode != 0:
            error = ValueError if "-d" in args else PgolfError
            text = (done.stdout + done.stderr).decode(errors="replace").replace("Fatal error - exiting", "")
            said = [line for line in text.splitlines() if re.search("error|fail", line, re.I)]
            raise error(
                f"lrzip {' '.join(args)} failed: {(said or [f'exit {done.returncode}'])[0].strip()[:200]}"
            )
        return out.read_bytes()


def _lrzip_size(stream: bytes) -> int:
    """The size an lrzip stream says it holds (its header: b"LRZI", version, uint64 size)."""
    if len(stream) < 14 or stream[:4] != b"LRZI":
        raise ValueError("a per-group stream is not lrzip data")
    return int.from_bytes(stream[6:14], "little")


def _each(fn: Callable[[bytes], bytes], items: list[bytes]) -> list[bytes]:
    """fn over items, one thread per CPU at most (lrzip runs in its own process), results in order."""
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(fn, items))


def lrzip_decompress(streams: list[bytes]) -> list[bytes]:
    """What each lrzip stream holds (in parallel); ValueError when one is damaged."""
    if streams:
        _require_lrzip("reading a pergroup artifact", writing=False)
    return _each(lambda s: _lrzip(s, ("-d",)), streams)


def _pergroup_pack(payload: bytes, shuffle: int) -> bytes:
    from core.common import pergroup

    parts = pergroup.split(payload)
    if parts.groups:
        _require_lrzip("the pergroup compressor")
    main = struct.pack("<I", len(parts.layout)) + parts.layout + parts.orders + parts.rest
    if shuffle and len(main) < shuffle:
        raise PgolfError(f"byte shuffle stride {shuffle} is longer than the per-group layout and rest")
    streams = [
        _brotli().compress(byte_shuffle(main, shuffle), quality=11),
        *_each(lambda g: _lrzip(g, LRZIP_ARGS), parts.groups),
    ]
    return struct.pack(f"<{len(streams) + 1}I", len(streams), *map(len, streams)) + b"".join(streams)


def split_streams(data: bytes, counts: range) -> list[bytes]:
    """The streams of a table `data` begins with (a uint32 count, in `counts`, then each one's uint32
    length) and that fill the rest of it, as `_pergroup_pack` writes them; ValueError when damaged."""
    count = int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
    if count not in counts or len(data) < 4 * (count + 1):
        raise ValueError(f"the per-group stream table is damaged ({count} streams)")
    lengths = struct.unpack(f"<{count}I", data[4 : 4 * (count + 1)])
    if 4 * (count + 1) + sum(lengths) != len(data):
        raise ValueError("the per-group streams do not add up to the data's length")
    ends = np.cumsum((4 * (count + 1), *lengths)).tolist()
    return [data[a:b] for a, b in itertools.pairwise(ends)]


def _pergroup_unpack(body: bytes, shuffled: bool) -> tuple[bytes, int]:
    """(payload, shuffle stride) of `_pergroup_pack`'s bytes; ValueError when damaged."""
    from core.common import pergroup

    streams = split_streams(body, range(1, len(pergroup.GROUPS) + 2))
    main, stride = _brotli_decompress(streams[0]), 0
    if shuffled:
        main, stride = byte_unshuffle(main, strict=True), main[4]
    size = int.from_bytes(main[:4], "little")
    layout = main[4 : 4 + size]
    try:
        total, sizes, order_bytes = pergroup.group_bytes(layout)
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the per-group layout is damaged: {first_line(exc)}") from None
    if total > MAX_OUTPUT_BYTES:
        raise ValueError(f"per-group data decompresses to more than {MAX_OUTPUT_BYTES:,} bytes")
    if len(sizes) != len(streams) - 1 or any(
        _lrzip_size(s) != n for s, n in zip(streams[1:], sizes, strict=False)
    ):
        raise ValueError("the per-group streams do not match their layout")
    groups = lrzip_decompress(streams[1:])
    orders = main[4 + size : 4 + size + order_bytes]
    return pergroup.join(layout, groups, orders, main[4 + size + order_bytes :]), stride


@dataclass(frozen=True)
class Compressor:
    name: str
    id: int  # the container's id byte (without SHUFFLE_FLAG); never reused
    default_level: int | None
    levels: range | None
    compress: Callable[[bytes, int | None], bytes]
    decompress: Callable[[bytes], bytes]


COMPRESSORS: dict[str, Compressor] = {
    c.name: c
    for c in (
        Compressor("none", 0, None, None, lambda data, level: data, _none_decompress),
        Compressor(
            "zlib", 1, 9, range(0, 10), lambda d, lv: zlib.compress(d, lv), _stream("zlib", zlib.decompressobj)
        ),
        Compressor(
            "lzma", 2, 9, range(0, 10),
            lambda d, lv: lzma.compress(d, preset=lv), _stream("lzma", lzma.LZMADecompressor),
        ),
        Compressor(
            "bz2", 3, 9, range(1, 10), lambda d, lv: bz2.compress(d, lv), _stream("bz2", bz2.BZ2Decompressor)
        ),
        Compressor(
            "brotli", 4, 11, range(0, 12), lambda d, lv: _brotli().compress(d, quality=lv), _brotli_decompress
        ),
        Compressor(
            "zstd", 5, 22, range(1, 23),
            lambda d, lv: _zstd().ZstdCompressor(level=lv).compress(d), _zstd_decompress,
        ),
        Compressor(
            PERGROUP, 6, None, None,
            lambda d, lv: _pergroup_pack(d, 0), lambda d: _pergroup_unpack(d, False)[0],
        ),
    )
}  # fmt: skip


def get(name: str) -> Compressor:
    if name not in COMPRESSORS:
        raise PgolfError(f"unknown compressor {name!r} (choose from {', '.join(COMPRESSORS)})")
    return COMPRESSORS[name]


def check_available(name: str) -> None:
    """Refuse, in one line, a compressor this machine cannot run: its package or program is missing."""
    get(name)
    if name in ("brotli", PERGROUP):
        _brotli()
    if name == "zstd":
        _zstd()
    if name == PERGROUP:
        _require_lrzip("the pergroup compressor")


def compressor_by_id(code: int) -> Compressor:
    for c in COMPRESSORS.values():
        if c.id == code:
            return c
    raise ValueError(f"unknown compressor id {code}")


def resolve_level(name: str, level: int | None) -> int | None:
    """The level to use: the compressor's default when None; refused when out of range."""
    c = get(name)
    if c.levels is None:
        return None
    level = c.default_level if level is None else level
    if level not in c.levels:
        raise PgolfError(f"compressor {name}: level {level} is not in {c.levels.start}..{c.levels.stop - 1}")
    return level


def compress(data: bytes, name: str, level: int | None = None) -> bytes:
    return get(name).compress(data, resolve_level(name, level))


def decompress(data: bytes, name: str) -> bytes:
    return get(name).decompress(data)


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
def pack(payload: bytes, name: str = "zlib", level: int | None = None, shuffle: int = 0) -> bytes:
    """One id byte (compressor id, | SHUFFLE_FLAG when shuffled) + the compressed payload.

    `shuffle` is the byte-shuffle stride (0 for none; 2 suits fp16 data); `pergroup` shuffles only the
    part of the payload it compresses with brotli.
    """
    c = get(name)
    lv = resolve_level(name, level)
    if shuffle not in (0, *range(2, 256)):
        raise PgolfError(f"byte shuffle stride {shuffle}: use 0 (none) or 2..255")
    if shuffle and len(payload) < shuffle:
        raise PgolfError(f"byte shuffle stride {shuffle} is longer than the {len(payload)}-byte payload")
    code = bytes([c.id | (SHUFFLE_FLAG if shuffle else 0)])
    if c.name == PERGROUP:
        return code + _pergroup_pack(payload, shuffle)
    return code + c.compress(byte_shuffle(payload, shuffle), lv)


def unpack(blob: bytes) -> tuple[bytes, str, int]:
    """(payload, compressor name, shuffle stride) from `pack`'s bytes; ValueError when damaged."""
    if not blob:
        raise ValueError("the compressor id byte is missing")
    code = blob[0]
    c = compressor_by_id(code & ~SHUFFLE_FLAG)
    if c.name == PERGROUP:
        payload, stride = _pergroup_unpack(blob[1:], bool(code & SHUFFLE_FLAG))
        return payload, c.name, stride
    body = c.decompress(blob[1:])
    if not code & SHUFFLE_FLAG:
        return body, c.name, 0
    return byte_unshuffle(body, strict=True), c.name, body[4]
