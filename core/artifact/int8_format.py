"""The int8 format (the challenge's, "int8_clean_per_row_v1"): quantization, dequantization, and its
model in pgolf's container (core/artifact/container.py; what both formats share: core/artifact/quantized.py).

Only the runs of this format (`quant_format = "int8"`) and the readers of its files import this
module; a run of the mixed format is packaged without it (core/config/features.py: `FEATURES`).

Quantization, bit for bit as the challenge's torch script computes it:
- non-float tensors pass through;
- float tensors of at most 65,536 elements pass through: control tensors (by the
  parameter table's class) in fp32,
  the others in fp16 with their original dtype recorded;
- larger 2-D tensors: per-row int8, clipped at the 99.99984th percentile of |w|,
  scale = max(clip/127, 1/127) stored in fp16;
- other large tensors: int8 with one fp32 scale (clip/127, or 1 when clip is 0).

In the container: tensors `q/<name>` (int8 values), `s/<name>` (scales: fp16 per row, or a 0-d
fp32) and `p/<name>` (passed through); the metadata holds format, version, quant_format, dtypes,
passthrough_orig_dtypes, qmeta.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.artifact.container import TOKENIZER_KEY, Container, container_bytes
from core.artifact.quantized import (
    CONTAINER_FORMAT,
    KEEP_FLOAT_MAX_NUMEL,
    Int8Model,
    _check_float16_range,
    _in_dtype,
    abs_quantile,
    container_tensors,
    dequantize_rows,
    fill_model,
    float_weight,
    to_float16,
)

__all__ = [
    "CONTAINER_VERSION",
    "QUANT_FORMAT",
    "artifact_bytes",
    "dequantize_int8",
    "int8_from_container",
    "quantize_int8",
]

QUANT_FORMAT = "int8_clean_per_row_v1"
CONTAINER_VERSION = 1


def _quantize_tensor(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and scales of a float32 tensor with more than KEEP_FLOAT_MAX_NUMEL elements."""
    if w.ndim == 2:
        clip = abs_quantile(w)
        scale = np.maximum(clip / np.float32(127.0), np.float32(1.0 / 127.0))
        # The fp32 scale divides; only its fp16 copy is stored (as upstream).
        q = np.round(np.clip(w, -clip[:, None], clip[:, None]) / scale[:, None])
        with np.errstate(over="ignore"):  # an overflow to inf is refused by the caller
            return np.clip(q, -127, 127).astype(np.int8), scale.astype(np.float16)
    clip = float(abs_quantile(w.reshape(1, -1))[0])
    scale = np.array(clip / 127.0 if clip > 0 else 1.0, dtype=np.float32)
    q = np.round(np.clip(w, -clip, clip) / scale)
    return np.clip(q, -127, 127).astype(np.int8), scale


def quantize_int8(
    state: dict[str, np.ndarray],
    orig_dtypes: dict[str, str] | None = None,
    classes: dict[str, str] | None = None,
) -> Int8Model:
    """Quantize weights; `orig_dtypes` names the dtype each had in the model (default: its own),
    `classes` the artifact class of each (core.model.params.artifact_classes): "control" ones stay fp32.

    Float weights arrive as float32; one recorded as bfloat16 or float16 is first
    rounded to that precision, so the result is what upstream gets from the model.
    (The challenge's export statistics of the result: tests/support/artifacts.py, int8_stats.)
    """
    orig_dtypes, classes = orig_dtypes or {}, classes or {}
    out = Int8Model()
    for name, value in state.items():
        t = np.asarray(value)
        if not np.issubdtype(t.dtype, np.floating):
            out.passthrough[name] = t
            continue
        dtype = orig_dtypes.get(name, t.dtype.name)
        w = float_weight(name, t, dtype)
        if t.size > KEEP_FLOAT_MAX_NUMEL:
            q, s = _quantize_tensor(w)
            _check_float16_range(name, w, s)
            if s.ndim > 0:
                out.qmeta[name] = {"scheme": "per_row", "axis": 0}
            out.quantized[name], out.scales[name], out.dtypes[name] = q, s, dtype
        elif classes.get(name) == "control":
            out.passthrough[name] = w
        else:
            out.passthrough[name] = to_float16(name, w)
            if dtype != "float16":
                out.passthrough_orig_dtypes[name] = dtype
    return out


def dequantize_int8(model: Int8Model) -> dict[str, np.ndarray]:
    """float32 weights holding exactly the values the upstream dequantizer gives (in their dtype)."""
    out = {
        name: _in_dtype(dequantize_rows(q, model.scales[name]), model.dtypes[name])
        for name, q in model.quantized.items()
    }
    for name, t in model.passthrough.items():  # float ones back in their dtype, others as stored
        dtype = model.passthrough_orig_dtypes.get(name, "float32" if t.dtype.kind == "f" else None)
        out[name] = _in_dtype(np.asarray(t, np.float32), dtype) if dtype else t
    return out


def artifact_bytes(
    model: Int8Model,
    compressor: str = "zlib",
    level: int | None = None,
    shuffle: int = 0,
    config: dict[str, Any] | None = None,
    tokenizer: str | None = None,
) -> bytes:
    """The file content of pgolf's container for `model` (`shuffle`: byte-shuffle stride, 0 for none;
    `config`: the run settings it is scored with, kept in the metadata, and `tokenizer`: the SHA-256
    of the tokenizer it was trained with)."""
    meta = {
        "format": CONTAINER_FORMAT,
        "version": CONTAINER_VERSION,
        "quant_format": QUANT_FORMAT,
        "dtypes": model.dtypes,
        "passthrough_orig_dtypes": model.passthrough_orig_dtypes,
        "qmeta": model.qmeta,
    }
    return container_bytes(container_tensors(model), meta, compressor, level, shuffle, config, tokenizer)


def int8_from_container(box: Container) -> Int8Model:
    """The int8 model of an opened pgolf container, as pgolf wrote it. Readers of other files than a
    run's own artifact check the container first (core/artifact/checks.py: `check_container`), and
    what the model holds after."""
    meta = box.meta
    model = Int8Model(
        dtypes=meta["dtypes"],
        passthrough_orig_dtypes=meta["passthrough_orig_dtypes"],
        qmeta=meta["qmeta"],
        tokenizer_sha256=meta.get(TOKENIZER_KEY),
    )
    return fill_model(model, box.tensors)
