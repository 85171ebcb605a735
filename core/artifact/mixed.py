"""Mixed-precision artifacts: int8/7/6/5 or fp16 per class of tensor, per-row fp16 scales.

The caller names each parameter's class ("embedding", "attention", "mlp", "other",
"control": the parameter table decides, never the spelling of a name) and the bits
of each class. Then, per tensor:
- non-float tensors pass through unchanged;
- "control" tensors pass through in fp32, whatever their size;
- float tensors of at most their class's floor of elements (the records: 65,536 for every
  class), and every tensor of a class set to "fp16", pass through in fp16 (their original dtype
  recorded);
- the rest are quantized to int-N with one fp16 scale per row (`core.artifact.rowquant`), or
  by GPTQ (`core.artifact.gptq`) when a Hessian of the layer's inputs is given for them;
- with `quant_gate`, the attention gates' weights (`*.attn_gate_w`, 32 to 8,192 values; control
  tensors otherwise) are int8 rows scaled by absmax / 127, method "gate";
- with LQER settings, the quantized matrices whose error is largest also keep a low-rank
  correction of it (`core.artifact.lqer`), added back when the artifact is read.

Container: pgolf's (`core.artifact.container.container_bytes`: magic, compressor id byte, the
compressed safetensors file) with tensors `q/<name>` (int8 holding the int-N
values), `s/<name>` (scales), `p/<name>` (passed through) and `lqer.qA/<name>`, `lqer.sA/...`,
`lqer.qB/...`, `lqer.sB/...` (LQER factors), and canonical JSON
metadata: format "pgolf-mixed", version, compressor, level, shuffle stride, and
per tensor its class, original dtype, storage ("int", "fp16", "fp32" or "raw") and,
when quantized, bits, clip method and method ("rows" or "gptq"), and "lqer" ("sym" or "asym")
when it has a correction. No pickle; the
same weights and settings give the same bytes; numpy alone reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.artifact.container import TOKENIZER_KEY, Container, container_bytes
from core.artifact.gptq import gptq_quantize
from core.artifact.lqer import LqerSettings, correction, corrections, ranked_errors
from core.artifact.quantized import (
    KEEP_FLOAT_MAX_NUMEL,
    QuantizedModel,
    _check_float16_range,
    _in_dtype,
    container_tensors,
    dequantize_rows,
    fill_model,
    float_weight,
    to_float16,
)
from core.artifact.rowquant import BITS, Clip, absmax_rows, quantize_tensor
from core.common import compress
from core.common.errors import PgolfError
from core.config.fields import ATTENTION_GATES
from core.model.params import KINDS

__all__ = [
    "CLASSES",
    "DEFAULT_BITS",
    "MixedModel",
    "dequantize_mixed",
    "mixed_artifact_bytes",
    "mixed_from_container",
    "quantize_mixed",
]

MIXED_FORMAT = "pgolf-mixed"
MIXED_VERSION = 1
CLASSES = KINDS  # the artifact classes of core.model.params' table
DEFAULT_BITS: dict[str, int | str] = {"embedding": 8, "attention": 6, "mlp": 6, "other": 8}
# The attention gates' weights quantized to int8 rows (GATED_ATTN_QUANT_GATE): those the gates' declaration
# says, within the records' size window.
GATE_SUFFIXES = tuple(
    sorted({"." + gate.weight.rsplit(".", 1)[-1] for gate in ATTENTION_GATES if gate.int8_rows})
)
GATE_MIN_NUMEL, GATE_MAX_NUMEL = 32, 8192


@dataclass
class MixedModel(QuantizedModel):
    # Scales: fp16 (rows,) or 0-d (fp32 0-d allowed).
    # Per tensor: class, dtype (the model's), store; for "int": bits, clip (Clip.to_json() or None), method,
    # and "lqer" (its kind) when it has a correction.
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    lqer: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # name -> {qA, sA, qB, sB}


# ---------------------------------------------------------------- quantization
def _bits_table(bits: dict[str, int | str] | None) -> dict[str, int | str]:
    table = DEFAULT_BITS | (bits or {})
    for cls, b in table.items():
        if cls not in DEFAULT_BITS or (b != "fp16" and b not in BITS):
            raise PgolfError(
                f"bits for {cls}: {b!r}; the classes {', '.join(DEFAULT_BITS)} (control tensors always stay "
                "in fp32) take 8, 7, 6, 5 or 'fp16'"
            )
    return table


def quantize_mixed(
    state: dict[str, np.ndarray],
    classes: dict[str, str],
    bits: dict[str, int | str] | None = None,
    clip: dict[str, Clip] | None = None,
    hessians: dict[str, np.ndarray] | None = None,
    orig_dtypes: dict[str, str] | None = None,
    lqer: LqerSettings | None = None,
    quant_gate: bool = False,
    floors: dict[str, int] | None = None,
) -> MixedModel:
    """Quantize `state` class by class (see the module docstring).

    `bits` maps classes to 8, 7, 6, 5 or "fp16" (defaults: DEFAULT_BITS); `clip` maps classes
    to their Clip (default: the records' search); `hessians` maps a matrix's
    name to the (cols, cols) Hessian of its inputs, for GPTQ; `orig_dtypes` names the
    dtype each float tensor had in the model (bf16 ones are rounded to bf16 first); `lqer` adds
    the low-rank corrections of core/artifact/lqer.py; `floors` maps classes to the most elements
    a tensor of theirs may have and stay in fp16 (default: the records' 65,536).
    """
    table = _bits_table(bits)
    missing = sorted(state.keys() - classes.keys())
    if missing:
        raise PgolfError(f"quantize: no class given for {', '.join(missing[:5])}")
    hessians = hessians or {}
    unknown = sorted(hessians.keys() - state.keys())
    if unknown:
        raise PgolfError(f"quantize: Hessians given for tensors not in the model: {', '.join(unknown[:5])}")
    out = MixedModel()
    for name in sorted(state):
        t = np.asarray(state[name])
        cls = classes[name]
        if cls not in CLASSES:
            raise PgolfError(f"quantize: {name} has unknown class {cls!r} (classes: {', '.join(CLASSES)})")
        if not np.issubdtype(t.dtype, np.floating):
            if t.dtype.kind not in "biu":
                raise PgolfError(f"quantize: {name} has dtype {t.dtype}, neither float nor integer")
            out.passthrough[name] = t
            out.info[name] = {"class": cls, "dtype": t.dtype.name, "store": "raw"}
            continue
        dtype = (orig_dtypes or {}).get(name, t.dtype.name)
        w = float_weight(name, t, dtype)
        info = out.info[name] = {"class": cls, "dtype": dtype}
        b, c = 8, Clip.percentile(1.0)  # the gates', and the clip of any tensor but a matrix
        if (
            quant_gate
            and name.endswith(GATE_SUFFIXES)
            and w.ndim == 2
            and GATE_MIN_NUMEL <= w.size <= GATE_MAX_NUMEL
        ):
            (q, s), method = absmax_rows(w, 127, -127, 127), "gate"
        elif cls == "control":
            out.passthrough[name], info["store"] = w, "fp32"
            continue
        elif t.size <= (floors or {}).get(cls, KEEP_FLOAT_MAX_NUMEL) or table[cls] == "fp16":
            out.passthrough[name], info["store"] = to_float16(name, w), "fp16"
            continue
        else:
            b = int(table[cls])
            if w.ndim == 2:
                c = (clip or {}).get(cls, Clip())
            with np.errstate(over="ignore", invalid="ignore"):  # a scale past fp16 is refused below
                if name in hessians and w.ndim == 2:
                    (q, s), method = gptq_quantize(w, np.asarray(hessians[name]), b, c), "gptq"
                else:
                    (q, s), method = quantize_tensor(w, b, c), "rows"
            _check_float16_range(name, w, s)
        out.quantized[name], out.scales[name] = q, s
        info |= {"store": "int", "bits": b, "clip": c.to_json(), "method": method}
    return add_lqer(out, state, lqer) if lqer else out


def add_lqer(model: MixedModel, state: dict[str, np.ndarray], lqer: LqerSettings) -> MixedModel:
    """`model` (made of `state`, without corrections) given the LQER corrections `lqer` asks for: of its
    `lqer.top_k` matrices whose quantization error has the largest Frobenius norm."""
    dtypes = {name: info["dtype"] for name, info in model.info.items()}
    errors = ranked_errors(state, model.quantized, model.scales, dtypes)
    for name, (kind, packed) in corrections(errors, lqer).items():
        model.lqer[name] = packed
        model.info[name]["lqer"] = kind
    return model


def dequantize_mixed(model: MixedModel) -> dict[str, np.ndarray]:
    """float32 weights (in their model dtype's precision); non-float tensors as stored."""
    out: dict[str, np.ndarray] = {}
    for name, info in model.info.items():
        if info["store"] == "raw":
            out[name] = model.passthrough[name]
            continue
        if info["store"] == "int":
            w = dequantize_rows(model.quantized[name], model.scales[name])
        else:
            w = model.passthrough[name].astype(np.float32)
        if "lqer" in info:
            w = w + correction(model.lqer[name])
        out[name] = _in_dtype(w, info["dtype"])
    return out


# ------------------------------------------------------------------ container
def mixed_artifact_bytes(
    model: MixedModel,
    compressor: str = "brotli",
    level: int | None = None,
    shuffle: int = 2,
    config: dict[str, Any] | None = None,
    tokenizer: str | None = None,
) -> bytes:
    """The file content for `model`: by default the records' brotli-11 over a stride-2 byte shuffle;
    `config`, the run settings it is scored with, and `tokenizer`, the SHA-256 of the tokenizer it was
    trained with, go in the metadata."""
    meta = {
        "format": MIXED_FORMAT,
        "version": MIXED_VERSION,
        "compressor": compressor,
        "level": compress.resolve_level(compressor, level),
        "shuffle": shuffle,
        "tensors": model.info,
    }
    tensors = container_tensors(model)
    tensors |= {f"lqer.{part}/{k}": a for k, packed in model.lqer.items() for part, a in packed.items()}
    return container_bytes(tensors, meta, compressor, level, shuffle, config, tokenizer)


def mixed_from_container(box: Container) -> MixedModel:
    """The mixed-precision model of an opened pgolf container, as pgolf wrote it. Readers of other files
    than a run's own artifact check the container first (core/artifact/checks.py: `check_container`),
    and what the model holds after."""
    model = MixedModel(info=box.meta["tensors"], tokenizer_sha256=box.meta.get(TOKENIZER_KEY))
    return fill_model(model, box.tensors)
