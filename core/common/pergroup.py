"""The `pergroup` compressor (core/common/compress.py names it): the per-group layout of an artifact's
payload, and its streams (the layout, orders and rest by brotli, each group by the lrzip program).

The payload is pgolf's safetensors file. Its int8 matrices of one kind across the layers form a group:
`q/blocks.<i>.attn.c_q.weight` for every layer i, and so on for each kind in GROUPS (`q/tok_emb.weight`
alone is a group too). Within a group, in layer order, each matrix is stored transposed (a column of
values becomes contiguous), after its rows of the kinds in SORTED are put in `similarity_order`; the
orders are kept as uint16. Everything else (the safetensors header, scales, fp16 and other tensors)
stays in the payload's order, with the grouped matrices cut out: the rest.

`split` makes (layout, groups, orders, rest) of a payload and `join` puts them back, byte for byte.
The layout is canonical JSON naming where each grouped matrix lies in the payload, its shape, and
whether its rows were reordered: `join` needs nothing else. Bytes that are not a safetensors file
have no groups (all of them are the rest).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.common import compress
from core.common.errors import PgolfError, first_line

__all__ = [
    "GROUPS", "SORTED", "Split", "group_bytes", "join", "lrzip_decompress", "lrzip_timeout", "pack",
    "similarity_order", "split", "split_streams", "unpack", "unstack",
]  # fmt: skip

# The matrix kinds grouped across layers, in stream order, and those whose rows are reordered.
GROUPS = (
    "tok_emb.weight", "attn.c_k.weight", "attn.c_q.weight", "attn.c_v.weight", "attn.proj.weight",
    "mlp.fc.weight", "mlp.proj.weight",
)  # fmt: skip
SORTED = ("tok_emb.weight", "attn.c_q.weight", "mlp.fc.weight")
MAX_SORTED_ROWS = 2**16  # an order is stored as uint16
_LAYER = re.compile(r"blocks\.(\d+)\.(.+)")


def similarity_order(matrix: np.ndarray) -> np.ndarray:
    """The rows of an int8 matrix (at most MAX_SORTED_ROWS) in greedy nearest-neighbour order (uint16):
    from row 0, each next row is the unused one closest in L1 distance to the last, the lowest index among
    equals."""
    n = matrix.shape[0]
    rest = matrix.astype(np.int16)  # unused rows, compacted: `left` holds their indices
    left = np.arange(n)
    work = np.empty_like(rest)
    order = np.empty(n, dtype=np.uint16)
    current = rest[0].copy()
    rest[0], left[0] = rest[n - 1], left[n - 1]  # row 0 is used: the last unused row takes its place
    for k in range(1, n):
        m = n - k
        diff = np.subtract(rest[:m], current, out=work[:m])
        dist = np.abs(diff, out=diff).sum(axis=1, dtype=np.int32)  # exact: at most 254 per value
        ties = np.flatnonzero(dist == dist.min())
        j = ties[np.argmin(left[ties])]
        order[k] = left[j]
        current = rest[j].copy()
        rest[j], left[j] = rest[m - 1], left[m - 1]
    order[0] = 0
    return order


@dataclass(frozen=True)
class Split:
    layout: bytes  # canonical JSON: {"size": payload bytes, "groups": [{"name", "tensors": [[offset, rows, cols, sorted]]}]}
    groups: list[bytes]  # each group's matrices, transposed (rows reordered where sorted), in layer order
    orders: bytes  # the row orders (uint16) of the sorted matrices, in group and layer order
    rest: bytes  # the payload without the grouped matrices


def _members(payload: bytes) -> dict[str, list[tuple[int, int, int, int]]]:
    """kind -> [(layer, offset in the payload, rows, cols)] of the 2-D int8 tensors `q/...` of a safetensors
    file that are of a kind in GROUPS (a tensor outside the blocks: layer 0); nothing when the bytes are not
    one (or a tensor entry is malformed)."""
    members: dict[str, list[tuple[int, int, int, int]]] = {}
    try:
        size = int.from_bytes(payload[:8], "little")
        header = json.loads(payload[8 : 8 + size]) if 8 + size <= len(payload) else {}
        for name, entry in header.items():
            if name.startswith("q/") and entry["dtype"] == "I8" and len(entry["shape"]) == 2:
                (rows, cols), (start, end) = entry["shape"], entry["data_offsets"]
                match = _LAYER.fullmatch(name[2:])
                layer, kind = (int(match[1]), match[2]) if match else (0, name[2:])
                if rows * cols == end - start > 0 and 8 + size + end <= len(payload) and kind in GROUPS:
                    members.setdefault(kind, []).append((layer, 8 + size + start, rows, cols))
    except (AttributeError, KeyError, TypeError, UnicodeDecodeError, ValueError):
        return {}
    return members


def split(payload: bytes) -> Split:
    """The payload's groups, orders and rest, and the layout that joins them (see the module docstring)."""
    members = _members(payload)
    data = np.frombuffer(payload, dtype=np.uint8)
    keep = np.ones(len(payload), dtype=bool)
    layout, groups, orders = [], [], []
    for kind in (k for k in GROUPS if k in members):
        entries, blobs = [], []
        for _layer, start, rows, cols in sorted(members[kind]):
            matrix = data[start : start + rows * cols].view(np.int8).reshape(rows, cols)
            sort = kind in SORTED and rows <= MAX_SORTED_ROWS
            if sort:
                order = similarity_order(matrix)
                orders.append(order.astype("<u2").tobytes())
                matrix = matrix[order]
            blobs.append(matrix.T.tobytes())  # tobytes writes C order: the transpose's rows
            keep[start : start + rows * cols] = False
            entries.append([start, rows, cols, int(sort)])
        layout.append({"name": kind, "tensors": entries})
        groups.append(b"".join(blobs))
    meta = json.dumps({"size": len(payload), "groups": layout}, sort_keys=True, separators=(",", ":"))
    return Split(meta.encode(), groups, b"".join(orders), data[keep].tobytes())


def group_bytes(layout: bytes) -> tuple[int, list[int], int]:
    """(payload bytes, each group's bytes, the orders' bytes) a layout describes; ValueError when it is
    not one `split` writes (tensors out of the payload or overlapping)."""
    meta = json.loads(layout)
    size, spans, sizes, order_bytes = int(meta["size"]), [], [], 0
    for group in meta["groups"]:
        total = 0
        for start, rows, cols, sort in group["tensors"]:
            if min(start, rows, cols) < 0 or sort not in (0, 1) or (sort and rows > MAX_SORTED_ROWS):
                raise ValueError(f"a bad tensor entry in the per-group layout: {[start, rows, cols, sort]}")
            spans.append((start, start + rows * cols))
            total += rows * cols
            order_bytes += 2 * rows * sort
        sizes.append(total)
    spans.sort()
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)) or (spans and spans[-1][1] > size):
        raise ValueError("the per-group layout places tensors outside the payload or over each other")
    return size, sizes, order_bytes


def unstack(values: np.ndarray, rows: int, cols: int, order: np.ndarray | None) -> np.ndarray:
    """The (rows, cols) matrix whose rows, put in `order` (None: as they are) and transposed, are `values`."""
    matrix = values.reshape(cols, rows).T
    if order is None:
        return matrix
    order = order.astype(np.int64)
    if not np.array_equal(np.sort(order), np.arange(rows)):
        raise ValueError("a row order of the per-group data is not a permutation")
    restored = np.empty_like(matrix)
    restored[order] = matrix
    return restored


def join(layout: bytes, groups: list[bytes], orders: bytes, rest: bytes) -> bytes:
    """The payload `split` took apart; ValueError when the parts do not fit the layout."""
    size, sizes, order_bytes = group_bytes(layout)
    if [len(g) for g in groups] != sizes or len(orders) != order_bytes or len(rest) != size - sum(sizes):
        raise ValueError("the per-group streams do not have the sizes their layout gives")
    out = np.empty(size, dtype=np.uint8)
    keep = np.ones(size, dtype=bool)
    perms = np.frombuffer(orders, dtype="<u2")
    used = 0
    for group, blob in zip(json.loads(layout)["groups"], groups, strict=True):
        values, offset = np.frombuffer(blob, dtype=np.int8), 0
        for start, rows, cols, sort in group["tensors"]:
            order = perms[used : used + rows] if sort else None
            used += rows * sort
            matrix = unstack(values[offset : offset + rows * cols], rows, cols, order)
            offset += rows * cols
            out[start : start + rows * cols] = matrix.reshape(-1).view(np.uint8)
            keep[start : start + rows * cols] = False
    out[keep] = np.frombuffer(rest, dtype=np.uint8)
    return out.tobytes()


# ---------------------------------------------------------------- the compressor's streams
# ZPAQ at level 9, one thread: lrzip splits its input by its thread count (by default the machine's CPUs).
LRZIP_ARGS = ("-z", "-L", "9", "-p", "1")


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
        compress.require_lrzip("reading a pergroup artifact", writing=False)
    return _each(lambda s: _lrzip(s, ("-d",)), streams)


def pack(payload: bytes, shuffle: int) -> bytes:
    """The payload as the pergroup compressor stores it: a table of streams, the layout, orders and rest
    by brotli (byte-shuffled by `shuffle`), each group by lrzip."""
    parts = split(payload)
    if parts.groups:
        compress.require_lrzip("the pergroup compressor")
    main = struct.pack("<I", len(parts.layout)) + parts.layout + parts.orders + parts.rest
    if shuffle and len(main) < shuffle:
        raise PgolfError(f"byte shuffle stride {shuffle} is longer than the per-group layout and rest")
    streams = [
        compress._brotli().compress(compress.byte_shuffle(main, shuffle), quality=11),
        *_each(lambda g: _lrzip(g, LRZIP_ARGS), parts.groups),
    ]
    return struct.pack(f"<{len(streams) + 1}I", len(streams), *map(len, streams)) + b"".join(streams)


def split_streams(data: bytes, counts: range) -> list[bytes]:
    """The streams of a table `data` begins with (a uint32 count, in `counts`, then each one's uint32
    length) and that fill the rest of it, as `pack` writes them; ValueError when damaged."""
    count = int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
    if count not in counts or len(data) < 4 * (count + 1):
        raise ValueError(f"the per-group stream table is damaged ({count} streams)")
    lengths = struct.unpack(f"<{count}I", data[4 : 4 * (count + 1)])
    if 4 * (count + 1) + sum(lengths) != len(data):
        raise ValueError("the per-group streams do not add up to the data's length")
    ends = list(itertools.accumulate(lengths, initial=4 * (count + 1)))
    return [data[a:b] for a, b in itertools.pairwise(ends)]


def unpack(body: bytes, shuffled: bool) -> tuple[bytes, int]:
    """(payload, shuffle stride) of `pack`'s bytes; ValueError when damaged."""
    streams = split_streams(body, range(1, len(GROUPS) + 2))
    main, stride = compress._brotli_decompress(streams[0]), 0
    if shuffled:
        main, stride = compress.byte_unshuffle(main, strict=True), main[4]
    size = int.from_bytes(main[:4], "little")
    layout = main[4 : 4 + size]
    try:
        total, sizes, order_bytes = group_bytes(layout)
    except (KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"the per-group layout is damaged: {first_line(exc)}") from None
    if total > compress.MAX_OUTPUT_BYTES:
        raise ValueError(f"per-group data decompresses to more than {compress.MAX_OUTPUT_BYTES:,} bytes")
    if [_lrzip_size(s) for s in streams[1:]] != sizes:
        raise ValueError("the per-group streams do not match their layout")
    groups = lrzip_decompress(streams[1:])
    orders = main[4 + size : 4 + size + order_bytes]
    return join(layout, groups, orders, main[4 + size + order_bytes :]), stride
