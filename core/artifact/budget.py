"""Where an artifact's bytes go, class by class: the budget table `export` prints and `train` logs.

(A packaged run does not log it: the table compresses each class on its own, which a long
record's artifact takes a while to do, and the run's own size lines say what counts.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from core.artifact.checks import check_mixed
from core.artifact.container import pack_body, payload_bytes
from core.artifact.export import ExportReport
from core.artifact.mixed import CLASSES, MixedModel, dequantize_mixed, mixed_artifact_bytes
from core.artifact.quantized import Int8Model
from core.common import compress
from core.config.fields import BUDGET_BYTES, Config
from core.model.params import artifact_classes

__all__ = ["budget_table", "export_budget", "format_budget", "from_int8"]


def from_int8(model: Int8Model, classes: dict[str, str]) -> MixedModel:
    """The int8 format's model described as a mixed one (int8 everywhere): for budget tables."""
    out = MixedModel(dict(model.quantized), dict(model.scales), dict(model.passthrough))
    for name in model.quantized:
        info = {"dtype": model.dtypes[name], "store": "int", "bits": 8, "clip": None, "method": "rows"}
        out.info[name] = {"class": classes.get(name, "other"), **info}
    for name, t in model.passthrough.items():
        if t.dtype.kind in "biu":
            info = {"dtype": t.dtype.name, "store": "raw"}
        elif t.dtype == np.float16:
            info = {"dtype": model.passthrough_orig_dtypes.get(name, "float16"), "store": "fp16"}
        else:
            info = {"dtype": "float32", "store": "fp32"}
        out.info[name] = {"class": classes.get(name, "other"), **info}
    return check_mixed(out)


def _label(info: dict[str, Any]) -> str:
    return f"int{info['bits']}" if info["store"] == "int" else info["store"]


def budget_table(
    model: MixedModel,
    compressor: str = "brotli",
    level: int | None = None,
    shuffle: int = 2,
    weights: dict[str, np.ndarray] | None = None,
    total_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Where the bytes go: one row per class present (in CLASSES order), then a "total" row.

    Per row: class, tensors, params, bits (e.g. "int6" or "int6+fp16"), bytes_raw (the
    class's values, scales and passed-through tensors as stored), bytes_compressed
    (those bytes compressed on their own with the artifact's compressor and shuffle; for pergroup,
    the class's tensors as a payload of their own;
    the total row has the whole artifact's size instead, so the rows need not add up),
    share (bytes_compressed / 16,000,000) and rms (root mean square of the weights:
    those in `weights` where given, e.g. the float ones before quantization, else the
    dequantized ones). `total_bytes`: the size of the file written, when known (else the
    mixed container's size is computed).
    """
    weights = dequantize_mixed(model) | dict(weights or {})
    rows = []
    for cls in CLASSES:
        names = sorted(n for n, i in model.info.items() if i["class"] == cls)
        if not names:
            continue
        raw = b"".join(
            part.tobytes()
            for n in names
            for part in (
                (model.quantized[n], model.scales[n]) if n in model.quantized else (model.passthrough[n],)
            )
        )
        packed = raw
        if compressor == compress.PERGROUP:  # it finds its groups by tensor name: the class's own payload
            parts = (("q", model.quantized), ("s", model.scales), ("p", model.passthrough))
            packed = payload_bytes(
                {f"{role}/{n}": part[n] for role, part in parts for n in names if n in part}
            )
        size = len(pack_body(packed, compressor, level, shuffle if len(packed) >= shuffle else 0)) - 1
        rows.append(_budget_row(cls, names, model, weights, len(raw), size))
    total = (
        total_bytes
        if total_bytes is not None
        else len(mixed_artifact_bytes(model, compressor, level, shuffle))
    )
    raw_total = sum(r["bytes_raw"] for r in rows)
    rows.append(_budget_row("total", sorted(model.info), model, weights, raw_total, total))
    return rows


def _budget_row(
    cls: str, names: list[str], model: MixedModel, weights: dict[str, np.ndarray], raw: int, packed: int
) -> dict[str, Any]:
    floats = [np.asarray(weights[n], dtype=np.float64) for n in names if model.info[n]["store"] != "raw"]
    count = sum(a.size for a in floats)
    rms = math.sqrt(sum(float(np.square(a).sum()) for a in floats) / count) if count else 0.0
    return {
        "class": cls,
        "tensors": len(names),
        "params": int(sum(np.asarray(weights[n]).size for n in names)),
        "bits": "+".join(sorted({_label(model.info[n]) for n in names})),
        "bytes_raw": raw,
        "bytes_compressed": packed,
        "share": packed / BUDGET_BYTES,
        "rms": rms,
    }


def export_budget(report: ExportReport, cfg: Config, params: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The budget table of what `export_artifact` wrote of `params` with `cfg` (see `budget_table`): one row
    per tensor class, then the total."""
    model = report.model
    view = from_int8(model, artifact_classes(cfg)) if isinstance(model, Int8Model) else model
    return budget_table(
        view,
        cfg.compressor,
        shuffle=cfg.byte_shuffle,
        weights=params,
        total_bytes=report.sizes["model_bytes"],
    )


def format_budget(report: ExportReport, cfg: Config, params: dict[str, np.ndarray]) -> list[str]:
    """`export_budget`'s table as aligned text lines (the train log and `export`)."""
    header = f"{'class':<10} {'tensors':>7} {'params':>11} {'bits':>10} {'raw B':>11} {'packed B':>11} {'share':>7} {'rms':>8}"
    lines = [header]
    for r in export_budget(report, cfg, params):
        lines.append(
            f"{r['class']:<10} {r['tensors']:>7} {r['params']:>11,} {'' if r['class'] == 'total' else r['bits']:>10} "
            f"{r['bytes_raw']:>11,} "
            f"{r['bytes_compressed']:>11,} {100 * r['share']:>6.2f}% {r['rms']:>8.5f}"
        )
    return lines
