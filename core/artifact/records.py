"""The challenge records' own quantized artifact (`final_model.int6.ptz`), read into a MixedModel.

Layout (records 2026-04-01 to 2026-04-27): `torch.save({"w": tensors, "m": meta})`, byte-shuffled
(b"BSHF" header, `core.common.compress.byte_shuffle`; not by 2026-04-27), then brotli-11 (or lzma, by
the record's COMPRESSOR setting). In "m", per parameter name:
- "passthrough" / "passthrough_ctrl" / "passthrough (float16)": "w"[name] as stored
  (fp16 for small floats, fp32 for large control tensors, or a non-float tensor);
- {"type": "int6"[, "method": "gptq" | "clip_search"]}, "gptq (int<N>)": int8 values
  "w"[name + ".q"] in [-R, R] and fp16 scales "w"[name + ".scale"] (per row, or 0-d);
- {"type": "int8"}: int8 values in [-127, 127] and fp16 per-row scales (or a 0-d fp32 one);
- (2026-04-27) "gptq (int<N>)+lqer" / "+lqer_asym": the same, plus LQER factors "w"[name + ".lqA",
  ".lqAs", ".lqB", ".lqBs"] (with the suffix "_a" when asymmetric: core/artifact/lqer.py's packings);
- (2026-04-27) "gate_int8_row": an attention gate's int8 rows "w"[name + ".gq"] and fp16 scales ".gs".
A value is q * scale, cast to the model's dtype, which the file does not record. By default it is
the records' own: they score a model cast with `.bfloat16()` whose linear layers, vectors and control
tensors go back to fp32, so the embedding tables (`tok_emb.weight`, `*.embed.weight`: the tensors
pgolf's parameter table keeps in the compute dtype) are bf16 and the rest fp32; `orig_dtypes` overrides it.

Record 2026-04-27 with COMPRESSOR=pergroup writes instead b"PGRP", a uint32 count (9), the uint32
lengths, then the streams: one per matrix kind of core/common/pergroup.py's GROUPS, in that order
(empty when absent), each holding the kind's int8 values ("w"[name + ".q"], layer after layer) as
`pergroup.split` lays a group out (transposed; rows of the SORTED kinds reordered), through lrzip;
then brotli over torch.save({"r": the other tensors of "w", "m": meta, "s": each group's shapes,
keyed "_tok_emb.weight.q" or "<kind>.q"}); then brotli over the row orders (uint16).

The torch.save container is a pickle. It is opened with `torch.load(weights_only=True)`,
which rebuilds tensors and plain containers only and refuses anything else; torch is
imported here, lazily, and only for this.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from core.artifact.checks import check_mixed
from core.artifact.container import MAX_ARTIFACT_BYTES
from core.artifact.mixed import CLASSES, MixedModel
from core.artifact.quantized import CLIP_QUANTILE, FLOAT_BYTES
from core.artifact.rowquant import Clip
from core.common import compress, pergroup
from core.common.errors import PgolfError, first_line
from core.common.files import read_file

__all__ = ["decompress_record_blob", "load_record_artifact", "record_compressor"]

_XZ_MAGIC = b"\xfd7zXZ\x00"
PERGROUP_MAGIC = b"PGRP"  # record 2026-04-27's per-group blob
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def record_compressor(blob: bytes) -> str:
    """The compressor of a record's .ptz (its COMPRESSOR): pergroup, lzma, zstd or zlib by their magic,
    else brotli."""
    if blob.startswith(PERGROUP_MAGIC):
        return "pergroup"
    if blob.startswith(_XZ_MAGIC):
        return "lzma"
    if blob.startswith(_ZSTD_MAGIC):
        return "zstd"
    if len(blob) >= 2 and blob[0] & 0x0F == 8 and (blob[0] * 256 + blob[1]) % 31 == 0:
        return "zlib"
    return "brotli"


def decompress_record_blob(blob: bytes) -> bytes:
    """The torch.save bytes inside a record's .ptz: xz, zstd or zlib by their magic, else brotli; unshuffled."""
    raw = compress.decompress(blob, record_compressor(blob))
    return compress.byte_unshuffle(raw)  # the record's reader: unshuffle when the header is there


def _pergroup_record(blob: bytes) -> dict[str, Any]:
    """The {"w", "m"} of a record's per-group blob (see the module docstring)."""
    import torch

    count = len(pergroup.GROUPS) + 2
    streams = pergroup.split_streams(blob[len(PERGROUP_MAGIC) :], range(count, count + 1))
    rest = _torch_load(compress.decompress(streams[-2], "brotli"))
    if not isinstance(rest, dict) or not {"r", "m", "s"} <= set(rest):
        raise ValueError("the per-group rest is not a dict with 'r', 'm' and 's'")
    orders = np.frombuffer(compress.decompress(streams[-1], "brotli") if streams[-1] else b"", dtype="<u2")
    kinds = [k for k, stream in zip(pergroup.GROUPS, streams, strict=False) if stream]
    tensors, used = dict(rest["r"]), 0
    for kind, data in zip(kinds, pergroup.lrzip_decompress([s for s in streams[:-2] if s]), strict=True):
        alone = f"_{kind}.q" in rest["s"]  # a kind outside the blocks (tok_emb): "_" before its key
        shapes = [tuple(s) for s in rest["s"][f"_{kind}.q" if alone else f"{kind}.q"]]
        names = [f"{kind}.q"] if alone else [f"blocks.{i}.{kind}.q" for i in range(len(shapes))]
        values, offset = np.frombuffer(data, dtype=np.int8), 0
        if sum(math.prod(shape) for shape in shapes) != values.size:
            raise ValueError(f"the {kind} stream does not hold its shapes' values")
        for name, shape in zip(names, shapes, strict=True):
            chunk = values[offset : offset + math.prod(shape)]
            offset += chunk.size
            if len(shape) == 2:
                rows = shape[0]
                order = orders[used : used + rows] if kind in pergroup.SORTED else None
                used += rows if order is not None else 0
                chunk = pergroup.unstack(chunk, rows, shape[1], order)
            tensors[name] = torch.from_numpy(np.ascontiguousarray(chunk).reshape(shape))
    if used != orders.size:
        raise ValueError(f"{orders.size} row orders stored, {used} used")
    return {"w": tensors, "m": rest["m"]}


def _torch_load(raw: bytes) -> Any:
    try:
        import torch
    except ImportError:
        raise PgolfError(
            "reading a record's .ptz artifact needs PyTorch: pip install 'pgolf[torch]'"
        ) from None
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def _to_numpy(t: Any, key: str) -> np.ndarray:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{key!r} is not a tensor")
    if t.dtype == torch.bfloat16:  # numpy has no bf16; float32 holds its values exactly
        t = t.float()
    return t.detach().cpu().contiguous().numpy()


def _entry(info: Any) -> tuple[str, int | None, str, str | None]:
    """(kind, bits, method, LQER kind) of one "m" entry: kind "pass" or "int"."""
    if isinstance(info, str):
        if info.startswith("passthrough"):
            return "pass", None, "", None
        if info == "gate_int8_row":
            return "int", 8, "gate", None
        match = re.fullmatch(r"gptq \(int([5-8])\)(\+lqer(_asym)?)?", info)
        if match:
            lqer = None if not match.group(2) else "asym" if match.group(3) else "sym"
            return "int", int(match.group(1)), "gptq", lqer
    elif isinstance(info, dict) and info.get("type") in ("int6", "int8"):
        method = "gptq" if info.get("method") == "gptq" else "rows"
        return "int", 6 if info["type"] == "int6" else 8, method, None
    raise ValueError(f"unknown entry {info!r}")


# The parts of each stored form: (values, scales) and the LQER factors, by the record's suffixes.
PARTS = {"gate": (".gq", ".gs"), "gptq": (".q", ".scale"), "rows": (".q", ".scale")}
RECORD_LQER = {"qA": ".lqA", "sA": ".lqAs", "qB": ".lqB", "sB": ".lqBs"}  # pgolf's factor -> suffix
LQER_SUFFIXES = {"sym": "", "asym": "_a"}


# The records' embedding tables, which their bf16 evaluation model keeps in bf16.
RECORD_BF16_NAMES = re.compile(r"(^|\.)(tok_emb|embed)\.weight$")


def _dtype(name: str, orig_dtypes: dict[str, str]) -> str:
    return orig_dtypes.get(name, "bfloat16" if RECORD_BF16_NAMES.search(name) else "float32")


def _parse(obj: Any, orig_dtypes: dict[str, str], classes: dict[str, str]) -> MixedModel:
    if not isinstance(obj, dict) or not isinstance(obj.get("w"), dict) or not isinstance(obj.get("m"), dict):
        raise ValueError("not a record artifact (a dict with 'w' and 'm' maps)")
    tensors, meta = obj["w"], obj["m"]
    model = MixedModel()
    used = set()
    for name, entry in meta.items():
        if not isinstance(name, str):
            raise ValueError(f"parameter name {name!r} is not a string")
        kind, bits, method, lqer = _entry(entry)
        cls = classes.get(name, "other")
        if cls not in CLASSES:
            raise PgolfError(f"{name} has unknown class {cls!r} (classes: {', '.join(CLASSES)})")
        if kind == "pass":
            if name not in tensors:
                raise ValueError(f"{name!r} is missing")
            t = _to_numpy(tensors[name], name)
            used.add(name)
            model.passthrough[name] = t
            if t.dtype.kind in "biu":
                model.info[name] = {"class": cls, "dtype": t.dtype.name, "store": "raw"}
                continue
            store = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}.get(t.dtype)
            if store is None:
                raise ValueError(f"{name}: passed through as {t.dtype}")
            model.info[name] = {"class": cls, "dtype": _dtype(name, orig_dtypes), "store": store}
            continue
        values, scales = PARTS[method]
        factors = {} if lqer is None else {k: part + LQER_SUFFIXES[lqer] for k, part in RECORD_LQER.items()}
        for suffix in (values, scales, *factors.values()):
            if name + suffix not in tensors:
                raise ValueError(f"{name + suffix!r} is missing")
            used.add(name + suffix)
        model.quantized[name] = _to_numpy(tensors[name + values], name + values)
        model.scales[name] = _to_numpy(tensors[name + scales], name + scales)
        if factors:
            model.lqer[name] = {
                k: _to_numpy(tensors[name + part], name + part) for k, part in factors.items()
            }
        clip: dict[str, Any] | None = None  # 2026-04-05's SDClip k is not in the file
        if method == "gate":  # scaled by each row's largest |value|
            clip = Clip.percentile(1.0).to_json()
        elif bits == 8:  # the records' int8 path: the baseline's clip
            clip = Clip.percentile(CLIP_QUANTILE).to_json()
        elif isinstance(entry, dict):  # 2026-04-01: the five-quantile search; largest |w| for vectors
            clip = (Clip() if model.scales[name].ndim else Clip.percentile(1.0)).to_json()
        model.info[name] = {
            "class": cls,
            "dtype": _dtype(name, orig_dtypes),
            "store": "int",
            "bits": bits,
            "clip": clip,
            "method": method,
        } | ({"lqer": lqer} if lqer else {})
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"tensor {extra[0]!r} has no entry in 'm'")
    return check_mixed(model)


def load_record_artifact(
    path: str | Path, orig_dtypes: dict[str, str] | None = None, classes: dict[str, str] | None = None
) -> MixedModel:
    """A record's `final_model.int6.ptz` as a MixedModel (dequantize with `core.artifact.mixed.dequantize_mixed`).

    `orig_dtypes`: the model's dtype per name where it is not float32; `classes`: the
    class per name for budget tables (default "other"). Damage is one PgolfError line.
    """
    path = Path(path)
    orig_dtypes = dict(orig_dtypes or {})
    for name, dtype in orig_dtypes.items():
        if dtype not in FLOAT_BYTES:
            raise PgolfError(f"{name}: dtype {dtype!r} is not one of {', '.join(FLOAT_BYTES)}")
    blob = read_file(path, "artifact", MAX_ARTIFACT_BYTES)
    try:
        if blob.startswith(PERGROUP_MAGIC):
            return _parse(_pergroup_record(blob), orig_dtypes, dict(classes or {}))
        raw = decompress_record_blob(blob)
        if not raw.startswith(b"PK"):
            raise ValueError("no torch.save (zip) data inside")
        return _parse(_torch_load(raw), orig_dtypes, dict(classes or {}))
    except PgolfError as exc:
        raise PgolfError(f"artifact {path}: {exc}") from None
    except Exception as exc:  # any decoding failure of a damaged file is a problem with the input
        raise PgolfError(f"artifact {path} is damaged or not a record artifact: {first_line(exc)}") from None
