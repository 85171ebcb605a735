"""What a reader checks in a quantized model before using it: everything dequantization relies on.

Readers of files pgolf did not just write (core/artifact/load.py, upstream.py, records.py,
`mixed.load_mixed_artifact`) check what they read; a run reading back the artifact it has
just written does not (the container's sha256 says the payload is the one written).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from core.artifact.container import MAGIC, MAGIC_V1, TOKENIZER_KEY, Container
from core.artifact.int8_format import CONTAINER_VERSION, QUANT_FORMAT
from core.artifact.mixed import CLASSES, MIXED_FORMAT, MIXED_VERSION, MixedModel
from core.artifact.quantized import CONTAINER_FORMAT, FLOAT_BYTES, Int8Model
from core.artifact.rowquant import BITS, Clip, clip_range
from core.common.errors import PgolfError

STORES = ("int", "fp16", "fp32", "raw")  # how the mixed format keeps a tensor
METHODS = ("rows", "gptq", "gate")  # how it rounded a quantized one
CLIP_KINDS = ("percentile", "search", "sdclip")  # how it chose the clip of each row (rowquant.Clip)
LQER_PARTS = ("lqer.qA", "lqer.sA", "lqer.qB", "lqer.sB")  # the roles of its LQER factors' tensors
# Each container format: its name in messages, the version this pgolf reads.
FORMATS = {CONTAINER_FORMAT: ("int8", CONTAINER_VERSION), MIXED_FORMAT: ("mixed-precision", MIXED_VERSION)}

__all__ = [
    "check_container",
    "check_finite",
    "check_int8",
    "check_mixed",
    "check_model",
    "clip_from_json",
    "is_container",
]


def is_container(blob: bytes) -> bool:
    """Whether `blob` starts as a pgolf container does (either version)."""
    return blob.startswith((MAGIC, MAGIC_V1))


def check_container(box: Container, want: str | None = None) -> Container:
    """What reading the model of an opened pgolf container relies on in its metadata and tensor names:
    the format `want` (by default the one it names: the mixed format, else int8) at the version this
    pgolf reads, that format's metadata, and no tensor of another role. ValueError naming the first
    problem; what the model holds is checked after (`check_model`)."""
    meta = box.meta
    want = want or (MIXED_FORMAT if meta["format"] == MIXED_FORMAT else CONTAINER_FORMAT)
    what, version = FORMATS[want]
    if meta["format"] != want:
        raise ValueError(f"format {meta['format']!r}, not the {what} format {want!r}")
    if meta.get("version") != version:
        raise ValueError(f"{what} format version {meta.get('version')!r} (this pgolf reads {version})")
    roles = {"q", "s", "p"}
    if want == MIXED_FORMAT:
        if meta.get("compressor") != box.compressor or meta.get("shuffle") != box.shuffle:
            raise ValueError(
                f"metadata says {meta.get('compressor')!r} with shuffle {meta.get('shuffle')!r}, "
                f"the file is {box.compressor!r} with shuffle {box.shuffle}"
            )
        info = meta.get("tensors")
        if not isinstance(info, dict) or not all(isinstance(v, dict) for v in info.values()):
            raise ValueError("'tensors' is not a map of names to descriptions")
        roles |= set(LQER_PARTS)
    else:
        if meta.get("quant_format") != QUANT_FORMAT:
            raise ValueError(f"quant format {meta.get('quant_format')!r} (this pgolf reads {QUANT_FORMAT})")
        for key, kind in (("dtypes", str), ("passthrough_orig_dtypes", str), ("qmeta", dict)):
            names_to(meta, key, kind)
    digest = meta.get(TOKENIZER_KEY)
    if digest is not None and not (isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest)):
        raise ValueError(f"{TOKENIZER_KEY} is not a SHA-256")
    for key in box.tensors:
        if key.partition("/")[0] not in roles:
            raise ValueError(f"unexpected tensor {key!r}")
    return box


def names_to(obj: dict, key: str, kind: type) -> dict:
    """obj[key], checked to map names to `kind`: the shape every reader of an int8 model relies on."""
    if key not in obj:
        raise ValueError(f"{key!r} is missing")
    value = obj[key]
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, kind) for k, v in value.items()
    ):
        raise ValueError(f"{key!r} is not a map of names to {kind.__name__}")
    return dict(value)


def check_finite(arrays: dict[str, np.ndarray]) -> None:
    """ValueError naming the first float array holding a NaN or an infinity (weights never do)."""
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(f"{name} holds NaN or infinite values")


def check_model(model: Int8Model | MixedModel) -> Int8Model | MixedModel:
    """`check_int8` or `check_mixed`, by the model's format."""
    return check_mixed(model) if isinstance(model, MixedModel) else check_int8(model)


def check_int8(model: Int8Model) -> Int8Model:
    """Everything dequantization relies on: int8 values, fitting float scales, known dtypes."""
    for name, q in model.quantized.items():
        s, dtype = model.scales.get(name), model.dtypes.get(name)
        if s is None:
            raise ValueError(f"{name} has no scales")
        if dtype not in FLOAT_BYTES:
            raise ValueError(f"{name} has unknown dtype {dtype!r}")
        if q.dtype != np.int8 or s.dtype not in (np.float16, np.float32):
            raise ValueError(
                f"{name}: values are {q.dtype} and scales {s.dtype}, expected int8 and fp16/fp32"
            )
        if s.ndim != 0 and (q.ndim == 0 or s.shape != (q.shape[0],)):
            raise ValueError(f"{name}: scales of shape {s.shape} do not fit values of shape {q.shape}")
        if name in model.passthrough:
            raise ValueError(f"{name} is both quantized and passed through")
    for name, t in model.passthrough.items():
        if not isinstance(t, np.ndarray) or t.dtype.kind not in "biuf":
            raise ValueError(f"{name}: passed-through value is not a numeric array")
    check_finite({**model.scales, **model.passthrough})
    for name, dtype in model.passthrough_orig_dtypes.items():
        if dtype not in FLOAT_BYTES:
            raise ValueError(f"{name} has unknown dtype {dtype!r}")
    return model


def check_mixed(model: MixedModel) -> MixedModel:
    """Everything dequantization relies on; ValueError naming the first problem."""
    described = set(model.info)
    stored = set(model.quantized) | set(model.scales) | set(model.passthrough) | set(model.lqer)
    if stored - described:
        raise ValueError(f"{sorted(stored - described)[0]} is stored but not described")
    for name, info in model.info.items():
        store, cls, dtype = info.get("store"), info.get("class"), info.get("dtype")
        if store not in STORES:
            raise ValueError(f"{name}: unknown storage {store!r}")
        if cls not in CLASSES:
            raise ValueError(f"{name}: unknown class {cls!r}")
        if store == "int":
            _check_quantized(name, info, model)
            continue
        if name in model.quantized or name in model.scales:
            raise ValueError(f"{name} is passed through but has quantized values or scales")
        t = model.passthrough.get(name)
        if not isinstance(t, np.ndarray):
            raise ValueError(f"{name} is missing")
        if store == "raw":
            if t.dtype.kind not in "biu" or dtype != t.dtype.name:
                raise ValueError(f"{name}: stored as {t.dtype}, described as raw {dtype!r}")
        elif t.dtype != np.dtype(np.float16 if store == "fp16" else np.float32) or dtype not in FLOAT_BYTES:
            raise ValueError(f"{name}: stored as {t.dtype}, described as {store} of {dtype!r}")
    check_finite(model.passthrough)
    for name in set(model.lqer) | {n for n, i in model.info.items() if "lqer" in i}:
        _check_lqer(name, model)
    return model


def _check_lqer(name: str, model: MixedModel) -> None:
    """An LQER correction: a described int matrix, int8 factors whose product has its shape, fitting scales."""
    kind, factors, q = model.info.get(name, {}).get("lqer"), model.lqer.get(name), model.quantized.get(name)
    if kind not in ("sym", "asym") or factors is None or q is None or q.ndim != 2:
        raise ValueError(f"{name}: an LQER correction without its matrix, its factors or its kind")
    if set(factors) != {"qA", "sA", "qB", "sB"}:
        raise ValueError(f"{name}: LQER factors {sorted(factors)}")
    q_a, s_a, q_b, s_b = (factors[k] for k in ("qA", "sA", "qB", "sB"))
    rank = q_a.shape[1] if q_a.ndim == 2 else -1
    if (
        q_a.dtype != np.int8
        or q_b.dtype != np.int8
        or q_a.shape != (q.shape[0], rank)
        or q_b.shape != (rank, q.shape[1])
    ):
        raise ValueError(
            f"{name}: LQER factors {q_a.shape} and {q_b.shape} do not make a {q.shape} correction"
        )
    if s_a.dtype != np.float16 or s_b.dtype != np.float16:
        raise ValueError(f"{name}: LQER scales are {s_a.dtype} and {s_b.dtype}, expected fp16")
    fits = (
        (s_a.shape == (), s_b.ndim == 1 and s_b.size > 0 and q_b.size % s_b.size == 0)
        if kind == "asym"
        else (s_a.shape == (q.shape[0],), s_b.shape == (rank,))
    )
    if not all(fits):
        raise ValueError(f"{name}: LQER scales {s_a.shape} and {s_b.shape} do not fit its {kind} factors")
    check_finite({f"{name} LQER scale A": s_a, f"{name} LQER scale B": s_b})


def _check_quantized(name: str, info: dict[str, Any], model: MixedModel) -> None:
    q, s, bits = model.quantized.get(name), model.scales.get(name), info.get("bits")
    if q is None or s is None:
        raise ValueError(f"{name} has no {'values' if q is None else 'scales'}")
    if name in model.passthrough:
        raise ValueError(f"{name} is both quantized and passed through")
    if info.get("dtype") not in FLOAT_BYTES:
        raise ValueError(f"{name} has unknown dtype {info.get('dtype')!r}")
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"{name}: bits {bits!r}")
    if info.get("method") not in METHODS:
        raise ValueError(f"{name}: unknown method {info.get('method')!r}")
    if info.get("clip") is not None:  # None: not known (an artifact converted from a record's)
        clip_from_json(info["clip"])
    if q.dtype != np.int8 or s.dtype not in (np.float16, np.float32):
        raise ValueError(f"{name}: values are {q.dtype} and scales {s.dtype}, expected int8 and fp16")
    if s.ndim != 0 and (q.ndim == 0 or s.shape != (q.shape[0],)):
        raise ValueError(f"{name}: scales of shape {s.shape} do not fit values of shape {q.shape}")
    if not np.isfinite(s).all():
        raise ValueError(f"{name}: scales hold NaN or infinite values")
    r = clip_range(bits)
    if q.size and int(np.abs(q.astype(np.int16)).max()) > r:
        raise ValueError(f"{name}: values beyond the int{bits} range [-{r}, {r}]")


def clip_from_json(obj: Any) -> Clip:
    """The Clip an artifact records (`Clip.to_json`); ValueError when it is not one."""
    if not isinstance(obj, dict) or set(obj) - {"kind", "q", "candidates", "per_row", "k"}:
        raise ValueError(f"clip {obj!r} is not a clip description")
    fields = dict(obj)
    if "candidates" in fields:
        if not isinstance(fields["candidates"], list):
            raise ValueError("clip candidates are not a list")
        fields["candidates"] = tuple(fields["candidates"])
    try:
        clip = Clip(**fields)
        if clip.kind == "sdclip":
            Clip.sdclip(clip.k)  # refuses a k out of its range
    except (PgolfError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if clip.kind not in CLIP_KINDS:
        raise ValueError(f"clip method {clip.kind!r}: choose from {', '.join(CLIP_KINDS)}")
    if clip.kind == "search" and not clip.candidates:
        raise ValueError("clip search: no candidate quantiles")
    for q in clip.quantiles:
        if not (isinstance(q, int | float) and 0.0 < q <= 1.0):
            raise ValueError(f"clip quantile {q!r} is not in (0, 1]")
    return clip
