"""The int8 artifact: format "int8_clean_per_row_v1", its containers, and the byte budget.

Quantization (the challenge's format, SPEC section 6):
- non-float tensors pass through;
- float tensors of at most 65,536 elements pass through: control tensors in fp32,
  the others in fp16 with their original dtype recorded;
- larger 2-D tensors: per-row int8, clipped at the 99.99984th percentile of |w|,
  scale = max(clip/127, 1/127) stored in fp16;
- other large tensors: int8 with one fp32 scale (clip/127, or 1 when clip is 0).

pgolf's container holds no pickle: a magic prefix, one compressor byte, then the
compressed bytes of a safetensors file (readable with numpy alone) whose tensors
are `q/<name>` (int8), `s/<name>` (scales) and `p/<name>` (passthrough), and whose
single metadata entry "pgolf" is canonical JSON (format, version, dtypes). The
same weights always give the same bytes. The challenge's torch container
(`torch.save` + zlib) is read and written too; its MLX container (a pickle) is
read only when explicitly allowed, since unpickling can run code.
"""

from __future__ import annotations

import bz2
import io
import json
import lzma
import pickle
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core.atomic import write_atomic
from core.errors import PgolfError
from core.params import is_control, round_to_bfloat16

QUANT_FORMAT = "int8_clean_per_row_v1"
CONTAINER_FORMAT = "pgolf-int8"
CONTAINER_VERSION = 1
MAGIC = b"PGOLF-INT8\x00"
KEEP_FLOAT_MAX_NUMEL = 65_536
CLIP_QUANTILE = 99.99984 / 100.0
BUDGET_BYTES = 16_000_000  # code + compressed model, decimal bytes

COMPRESSORS = {"none": 0, "zlib": 1, "lzma": 2, "bz2": 3}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Int8Model:
    quantized: dict[str, np.ndarray] = field(default_factory=dict)  # int8
    scales: dict[str, np.ndarray] = field(default_factory=dict)  # fp16 per row, or a 0-d fp32
    dtypes: dict[str, str] = field(default_factory=dict)  # original dtype of each quantized tensor
    passthrough: dict[str, np.ndarray] = field(default_factory=dict)
    passthrough_orig_dtypes: dict[str, str] = field(default_factory=dict)  # for fp16-stored ones
    qmeta: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- quantization
def _quantile(sorted_abs: np.ndarray) -> np.ndarray:
    """torch.quantile's linear interpolation along the last axis, in float32 as torch does it."""
    n = sorted_abs.shape[-1]
    rank = np.float32(CLIP_QUANTILE) * np.float32(n - 1)
    below = int(np.floor(rank))
    above = min(below + 1, n - 1)
    weight = np.float32(rank - np.float32(below))
    lo, hi = sorted_abs[..., below], sorted_abs[..., above]
    # torch.lerp switches formula at weight 0.5 to stay exact at both ends.
    if weight < 0.5:
        return (lo + weight * (hi - lo)).astype(np.float32)
    return (hi - (hi - lo) * (np.float32(1.0) - weight)).astype(np.float32)


def _quantize_tensor(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = w.astype(np.float32)
    if w.ndim == 2:
        clip = _quantile(np.sort(np.abs(w), axis=1)) if w.size else np.zeros(w.shape[0], np.float32)
        scale = np.maximum(clip / np.float32(127.0), np.float32(1.0 / 127.0)).astype(np.float32)
        clipped = np.clip(w, -clip[:, None], clip[:, None])
        q = np.clip(np.round(clipped / scale[:, None]), -127, 127).astype(np.int8)
        return q, scale.astype(np.float16)
    clip = float(_quantile(np.sort(np.abs(w).reshape(-1)))) if w.size else 0.0
    scale = np.array(clip / 127.0 if clip > 0 else 1.0, dtype=np.float32)
    q = np.clip(np.round(np.clip(w, -clip, clip) / scale), -127, 127).astype(np.int8)
    return q, scale


def quantize_int8(state: dict[str, np.ndarray], orig_dtypes: dict[str, str] | None = None) -> Int8Model:
    """Quantize float32 weights; `orig_dtypes` names the dtype each had in the model."""
    orig_dtypes = orig_dtypes or {}
    out = Int8Model()
    stats = dict.fromkeys(
        ("param_count", "num_tensors", "num_float_tensors", "num_nonfloat_tensors",
         "baseline_tensor_bytes", "int8_payload_bytes"), 0,
    )  # fmt: skip
    for name, value in state.items():
        t = np.asarray(value)
        dtype = orig_dtypes.get(name, str(t.dtype))
        stats["param_count"] += t.size
        stats["num_tensors"] += 1
        stats["baseline_tensor_bytes"] += t.size * DTYPE_BYTES.get(dtype, t.itemsize)
        if not np.issubdtype(t.dtype, np.floating):
            stats["num_nonfloat_tensors"] += 1
            out.passthrough[name] = t
            stats["int8_payload_bytes"] += t.nbytes
            continue
        if t.size <= KEEP_FLOAT_MAX_NUMEL:
            if is_control(name):
                kept = t.astype(np.float32)
            elif dtype in ("float32", "bfloat16"):
                kept = t.astype(np.float16)
                out.passthrough_orig_dtypes[name] = dtype
            else:
                kept = t
            out.passthrough[name] = kept
            stats["int8_payload_bytes"] += kept.nbytes
            continue
        stats["num_float_tensors"] += 1
        q, s = _quantize_tensor(t)
        if s.ndim > 0:
            out.qmeta[name] = {"scheme": "per_row", "axis": 0}
        out.quantized[name], out.scales[name], out.dtypes[name] = q, s, dtype
        stats["int8_payload_bytes"] += q.nbytes + s.nbytes
    out.stats = {k: int(v) for k, v in stats.items()}
    return out


def _in_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to what `dtype` can hold (numpy has no bfloat16)."""
    if dtype == "bfloat16":
        return round_to_bfloat16(values)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    return values.astype(np.float32)


def dequantize_int8(model: Int8Model) -> dict[str, np.ndarray]:
    """float32 weights holding exactly the values the upstream dequantizer gives."""
    out: dict[str, np.ndarray] = {}
    for name, q in model.quantized.items():
        s = np.asarray(model.scales[name]).astype(np.float32)
        if s.ndim > 0:
            values = q.astype(np.float32) * s.reshape((q.shape[0],) + (1,) * (q.ndim - 1))
        else:
            values = q.astype(np.float32) * np.float32(s)
        out[name] = _in_dtype(values, model.dtypes.get(name, "float32"))
    for name, t in model.passthrough.items():
        t = np.asarray(t)
        if name in model.passthrough_orig_dtypes:
            out[name] = _in_dtype(t.astype(np.float32), model.passthrough_orig_dtypes[name])
        elif np.issubdtype(t.dtype, np.floating):
            out[name] = t.astype(np.float32)
        else:
            out[name] = t
    return out


# ------------------------------------------------------------- pgolf container
def _compress(data: bytes, compressor: str, level: int | None) -> bytes:
    if compressor == "zlib":
        return zlib.compress(data, 9 if level is None else level)
    if compressor == "lzma":
        return lzma.compress(data, preset=9 if level is None else level)
    if compressor == "bz2":
        return bz2.compress(data, 9 if level is None else level)
    return data


def _decompress(data: bytes, code: int) -> bytes:
    if code == COMPRESSORS["zlib"]:
        return zlib.decompress(data)
    if code == COMPRESSORS["lzma"]:
        return lzma.decompress(data)
    if code == COMPRESSORS["bz2"]:
        return bz2.decompress(data)
    if code == COMPRESSORS["none"]:
        return data
    raise ValueError(f"unknown compressor id {code}")


def artifact_bytes(model: Int8Model, compressor: str = "zlib", level: int | None = None) -> bytes:
    """The file content of pgolf's container for `model`."""
    if compressor not in COMPRESSORS:
        raise PgolfError(f"unknown compressor {compressor!r} (choose from {', '.join(COMPRESSORS)})")
    tensors = {f"q/{k}": v for k, v in model.quantized.items()}
    tensors |= {f"s/{k}": np.asarray(v) for k, v in model.scales.items()}
    tensors |= {f"p/{k}": np.asarray(v) for k, v in model.passthrough.items()}
    meta = {
        "format": CONTAINER_FORMAT,
        "version": CONTAINER_VERSION,
        "quant_format": QUANT_FORMAT,
        "dtypes": model.dtypes,
        "passthrough_orig_dtypes": model.passthrough_orig_dtypes,
        "qmeta": model.qmeta,
    }
    payload = st_save(
        {k: np.require(v, requirements="C") for k, v in tensors.items()},
        metadata={"pgolf": json.dumps(meta, sort_keys=True, separators=(",", ":"))},
    )
    return MAGIC + bytes([COMPRESSORS[compressor]]) + _compress(payload, compressor, level)


def save_artifact(
    path: str | Path, model: Int8Model, compressor: str = "zlib", level: int | None = None
) -> Path:
    return write_atomic(path, artifact_bytes(model, compressor, level))


def _parse_pgolf(blob: bytes) -> Int8Model:
    payload = _decompress(blob[len(MAGIC) + 1 :], blob[len(MAGIC)])
    tensors = st_load(payload)
    header_len = int.from_bytes(payload[:8], "little")
    meta = json.loads(json.loads(payload[8 : 8 + header_len])["__metadata__"]["pgolf"])
    if meta.get("format") != CONTAINER_FORMAT or meta.get("quant_format") != QUANT_FORMAT:
        raise ValueError("not a pgolf int8 artifact")
    if meta.get("version") != CONTAINER_VERSION:
        raise ValueError(f"unsupported container version {meta.get('version')}")
    model = Int8Model(
        dtypes=dict(meta["dtypes"]),
        passthrough_orig_dtypes=dict(meta["passthrough_orig_dtypes"]),
        qmeta=dict(meta["qmeta"]),
    )
    for key, value in tensors.items():
        role, _, name = key.partition("/")
        {"q": model.quantized, "s": model.scales, "p": model.passthrough}[role][name] = value
    return model


def _from_upstream_dict(obj: Any, to_numpy) -> Int8Model:
    if not isinstance(obj, dict) or obj.get("__quant_format__") != QUANT_FORMAT:
        raise ValueError("not an int8_clean_per_row_v1 object")
    return Int8Model(
        quantized={k: to_numpy(v) for k, v in obj["quantized"].items()},
        scales={k: to_numpy(v) for k, v in obj["scales"].items()},
        dtypes=dict(obj["dtypes"]),
        passthrough={k: to_numpy(v) for k, v in obj["passthrough"].items()},
        passthrough_orig_dtypes=dict(obj.get("passthrough_orig_dtypes", {})),
        qmeta=dict(obj.get("qmeta", {})),
    )


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:  # numpy has no bf16; float32 holds its values exactly
        t = t.float()
    return t.detach().cpu().contiguous().numpy()


def _parse_upstream_torch(raw: bytes, path: Path) -> Int8Model:
    try:
        import torch
    except ImportError:
        raise PgolfError(
            f"artifact {path}: reading the upstream torch artifact needs PyTorch: pip install 'pgolf[torch]'"
        ) from None
    obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    return _from_upstream_dict(obj, _torch_to_numpy)


def _check(model: Int8Model) -> Int8Model:
    """Structural sanity: every quantized tensor has a matching scale and a known dtype."""
    for name, q in model.quantized.items():
        s = model.scales.get(name)
        if s is None or name not in model.dtypes:
            raise ValueError(f"{name} has no scale or dtype")
        if q.dtype != np.int8 or (np.ndim(s) > 0 and (q.ndim == 0 or np.shape(s)[0] != q.shape[0])):
            raise ValueError(f"{name}: int8 values and scales do not fit together")
    return model


def load_artifact(path: str | Path, allow_pickle: bool = False) -> Int8Model:
    """Read pgolf's container, or the challenge's torch (or, if allowed, MLX pickle) container."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise PgolfError(f"artifact {path}: cannot read ({exc.strerror})") from None
    try:
        if blob.startswith(MAGIC):
            return _check(_parse_pgolf(blob))
        raw = zlib.decompress(blob)
        if raw.startswith(b"PK"):
            return _check(_parse_upstream_torch(raw, path))
        if raw[:1] == b"\x80":
            if not allow_pickle:
                raise PgolfError(
                    f"artifact {path} is a pickle (the upstream MLX format); unpickling can run code, "
                    "so load it only if you trust it, with --allow-pickle"
                )
            warnings.warn(f"unpickling {path}: only do this for files you trust", stacklevel=2)
            return _check(_from_upstream_dict(pickle.loads(raw), np.asarray))
    except PgolfError:
        raise
    except Exception as exc:  # any decoding failure of a damaged file is the user's input problem
        raise PgolfError(
            f"artifact {path} is corrupt or not an int8 artifact ({type(exc).__name__})"
        ) from None
    raise PgolfError(f"artifact {path} is not an int8 artifact (unknown container)")


def save_upstream_torch(path: str | Path, model: Int8Model) -> Path:
    """Write the challenge's own container (torch.save + zlib 9), loadable by train_gpt.py."""
    import torch

    def tensor(a: np.ndarray, dtype: str | None = None) -> Any:
        t = torch.from_numpy(np.array(a))
        return t.to(torch.bfloat16) if dtype == "bfloat16" else t

    obj: dict[str, Any] = {
        "__quant_format__": QUANT_FORMAT,
        "quantized": {k: tensor(v) for k, v in model.quantized.items()},
        "scales": {k: tensor(v) for k, v in model.scales.items()},
        "dtypes": dict(model.dtypes),
        "passthrough": {k: tensor(v) for k, v in model.passthrough.items()},
    }
    if model.qmeta:
        obj["qmeta"] = dict(model.qmeta)
    if model.passthrough_orig_dtypes:
        obj["passthrough_orig_dtypes"] = dict(model.passthrough_orig_dtypes)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_atomic(path, zlib.compress(buffer.getvalue(), level=9))


# ------------------------------------------------------------------ the budget
def code_bytes(paths: list[Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths)


def size_report(payload_bytes: int, model_bytes: int, code_bytes: int) -> dict[str, int]:
    total = model_bytes + code_bytes
    return {
        "payload_bytes": payload_bytes,
        "model_bytes": model_bytes,
        "code_bytes": code_bytes,
        "total_bytes": total,
        "budget_bytes": BUDGET_BYTES,
        "headroom_bytes": BUDGET_BYTES - total,
    }
