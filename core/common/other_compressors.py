"""The compressors other than brotli and pergroup: none, zlib, lzma, bz2 and zstd, each its compress and its
bounded decompress (core/common/compress.py's registry names them and imports this module where one is
used: a module of its own, as only the runs that use one of them need it; see OPTIONAL in
core/runs/package.py). zstandard is imported only when used."""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from core.common.compress import MAX_OUTPUT_BYTES, _package, _too_large


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
