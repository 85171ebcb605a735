"""The plan's factors fitted on the challenge's records, and the leave-one-out backtest that measures them.

Each records folder becomes one sample: its settings as a pgolf Config and the figures its logs give (the
median over its seeds): ms a step per training phase, peak memory, the compressed model's bytes, the seconds
of each evaluation phase. A folder pgolf cannot express is listed with the reason, never dropped silently:
a config is accepted only when pgolf's parameter table counts the parameters its log printed (within 0.1%:
a few scalars of the parallel lanes or gates differ), so its FLOPs and bytes are the record's own.

The table (core/runs/plan_table.json) keeps the coefficients, the bands the backtest measured, the
validation sizes, and the samples themselves, so that the fit can be redone and checked without the records.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np

from core.common import compress
from core.common.errors import PgolfError
from core.config.fields import Config
from core.config.sources import resolve
from core.model.params import count_params
from core.runs.plan import (
    HARDWARE,
    QUANTITIES,
    STEP_TERMS,
    Features,
    Hardware,
    entropy_bytes,
    features,
    gaussian_bits,
    predict_bytes,
    predict_eval,
    predict_memory,
    predict_steps,
    val_tokens,
)
from core.runs.record_logs import RecordFolder, RecordRun

PARAMS_TOLERANCE = 1e-3
# Settings of records that add weights pgolf has no field for (named in the reason a record is left out).
UNKNOWN_FEATURES = ("bigram_vocab_size", "mtp_num_heads", "canon_ac_layers", "bigram_hash", "lora_rank")
CLIP_GRID = [round(2.0 + 0.05 * i, 2) for i in range(361)]  # percentile clips searched, in sigmas
LABEL = re.compile(r"^(?:int(\d)|mixed_int\d_int(\d)|quantized)\+([a-z]+)")
# The fields a record's settings may set: what it computes, stores and evaluates; not where its files were.
FIELDS = {f.name for f in fields(Config) if f.metadata["section"] != "run"} - {
    "data_path",
    "tokenizer_path",
    "dataset",
}


class Unexpressed(Exception):
    """A records folder pgolf's config cannot express; the message says why."""


# --------------------------------------------------------------------------- records -> samples
def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _overrides(run: RecordRun, settings: dict[str, str], looped_log: bool) -> dict[str, Any]:
    """What the records name differently from pgolf, as pgolf's fields."""
    out: dict[str, Any] = {}
    world = run.world_size
    per_rank = int(float(settings.get("grad_accum_steps") or max(1, 8 // world)))
    out["grad_accum_steps"] = world * per_rank  # the records print it per rank, pgolf's is the total
    if "mlp_hidden" in settings and "model_dim" in settings:
        out["mlp_mult"] = int(settings["mlp_hidden"]) / int(float(settings["model_dim"]))
    recur = settings.get("recur_layers") or settings.get("recur_layers_str") or ""
    if recur.strip():
        layers = [int(x) for x in recur.split(",") if x.strip()]
        out |= {"num_loops": 1, "loop_start": min(layers), "loop_end": max(layers)}
    if "parallel_residual" in settings and not _truthy(settings["parallel_residual"]):
        out["parallel_start_layer"] = 0
    if not looped_log:  # the log never switched to a looped layout (NUM_LOOPS=1 of 2026-03-19: once through)
        out["num_loops"] = 0
    elif run.switches and run.points:
        stop = run.stop or run.points[-1]
        at = [t for s, t in sorted(run.points) if s <= run.switches[0]]
        if at and ("recur_start_step" in settings or "enable_looping_at" not in settings):
            out["enable_looping_at"] = min(0.99, at[-1] / stop[1])
    slid = "sliding" in run.eval_seconds
    if "sliding_window_enabled" in settings and not _truthy(settings["sliding_window_enabled"]):
        out["eval_stride"] = 0
    elif not slid and "eval_stride" in run.sources.get("log", {}):
        out["eval_stride"] = 0  # printed among its settings, but the script scored no windows
    if run.varlen:
        out["varlen_attn_enabled"] = True
    if _truthy(settings.get("ttt_enabled")) or "ttt_lora_rank" in run.sources.get("log", {}):
        out["ttt_enabled"] = True
        lora = "ttt_lora_rank" in settings
        out["ttt_mode"] = "lora" if lora else "full"
        if lora and "phased_ttt_prefix_docs" not in settings:
            out["phased_ttt_num_phases"] = 0
    out |= _quant(run, settings)
    return out


def _quant(run: RecordRun, settings: dict[str, str]) -> dict[str, Any]:
    """The artifact format its log's `Serialized model <format>` line names."""
    label = run.quant_label or ""
    if label.startswith("ternary"):
        raise Unexpressed("ternary weights: pgolf has no ternary format")
    m = LABEL.match(label)
    if not m:
        raise Unexpressed(f"the log names no artifact format pgolf has ({label or 'none'})")
    bits, high, compressor = m.groups()
    if bits == "8" and compressor == "zlib":
        return {"quant_format": "int8", "compressor": "zlib"}
    out: dict[str, Any] = {"quant_format": "mixed", "compressor": compressor}
    if bits:
        out["matrix_bits"] = int(bits)
    if high:  # "mixed_int5_int6": a per-tensor split the log ranks; the matrices counted at the higher
        out["matrix_bits"] = int(high)
    if "embed_bits" not in settings:
        out["embed_bits"] = 8
    return out


def record_config(folder: RecordFolder) -> tuple[Config, RecordRun]:
    """The config of a records folder (its last log's run), or Unexpressed with the reason."""
    runs = [r for r in folder.runs if r.model_params]
    if not runs:
        raise Unexpressed("no log prints model_params")
    run = runs[-1]
    if len(run.switches) > 1:
        raise Unexpressed("progressive recurrence: its looped layout grows twice, pgolf's switches on once")
    if not run.phases():
        raise Unexpressed("the log has no step times")
    orders = (RecordRun.ORDER, ("script", "readme", "log_script", "log"), ("script", "log_script", "log"))
    counted = []
    for order in orders:
        settings = run.settings_in(order)
        try:
            over = _overrides(run, settings, bool(run.switches))
            environ = {k.upper(): v for k, v in settings.items() if k in FIELDS and k not in over}
            cfg = resolve("baseline", None, over, environ=environ)
            cfg.validate()
        except PgolfError as exc:
            counted.append(str(exc))
            continue
        n = count_params(cfg)
        if abs(n - run.model_params) <= PARAMS_TOLERANCE * run.model_params:
            return cfg, run
        counted.append(f"{n:,}")
    hints = [
        f"{k}={v}" for k, v in run.settings.items() if k in UNKNOWN_FEATURES and v not in ("0", "", "False")
    ]
    why = f"; its settings without a pgolf field: {', '.join(hints)}" if hints else ""
    raise Unexpressed(
        f"pgolf counts {counted[0]} parameters where the log has {run.model_params:,} (its settings read three ways: "
        f"the script's defaults, the README's command, the log){why}"
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def logged_figures(folder: RecordFolder, run: RecordRun, cfg: Config) -> dict[str, Any]:
    """The median over the folder's runs of the same model: ms a step per phase, peak memory, the
    compressed model's bytes, each evaluation phase's seconds."""
    same = [r for r in folder.runs if r.model_params == run.model_params]
    count = len(run.phases())
    phases = [[p.ms_per_step for p in r.phases()] for r in same if len(r.phases()) == count]
    ev: dict[str, list[float]] = {}
    for r in same:
        seconds = dict(r.eval_seconds)
        if cfg.sliding_eval and "sliding" not in seconds and "roundtrip" in seconds:
            seconds["sliding"] = seconds.pop("roundtrip")  # its one scored pass slid windows
        for k, v in seconds.items():
            ev.setdefault(k, []).append(v)
    memory = _median([r.peak_memory_mib * 2**20 for r in same if r.peak_memory_mib])
    return {
        "ms_per_step": [statistics.median(col) for col in zip(*phases, strict=True)],
        "steps": _median([r.steps for r in same if r.steps]),
        "peak_memory_bytes": memory,
        "artifact_bytes": _median([r.quantized_bytes for r in same if r.quantized_bytes]),
        "code_bytes": _median([r.code_bytes for r in same if r.code_bytes]),
        "eval_seconds": {k: statistics.median(v) for k, v in ev.items()},
        "val_tokens": run.val_tokens,
    }


def samples_of(folders: list[RecordFolder]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The samples the records give, and the folders left out with the reason."""
    samples, left_out = [], []
    defaults = Config().to_dict()
    for folder in folders:
        try:
            cfg, run = record_config(folder)
        except Unexpressed as exc:
            left_out.append({"record": folder.name, "reason": str(exc)})
            continue
        samples.append({
            "record": folder.name,
            "config": {k: v for k, v in cfg.to_dict().items() if v != defaults[k]},
            "world_size": run.world_size,
            "gpu": run.gpu or "H100",
            "logs": len(folder.runs),
            "logged": logged_figures(folder, run, cfg),
        })  # fmt: skip
    return samples, left_out


# --------------------------------------------------------------------------- fitting
def sample_config(sample: dict[str, Any]) -> Config:
    return Config().replace(**sample["config"])


def sample_features(sample: dict[str, Any], known: dict[str, int]) -> Features:
    """A sample's features on its own machine (its GPUs, its validation tokens)."""
    cfg = sample_config(sample)
    hw = Hardware(sample["gpu"], sample["world_size"], HARDWARE["8xH100"].memory_bytes)
    return features(cfg, hw, sample["logged"]["val_tokens"] or val_tokens(known, cfg))


def _nnls(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Non-negative least squares of relative errors (each row scaled by its target)."""
    from scipy.optimize import nnls  # scipy, where it is used

    a = np.array([[x / t for x in row] for row, t in zip(rows, targets, strict=True)])
    coef, _ = nnls(a, np.ones(len(targets)), maxiter=10_000)
    return [float(c) for c in coef]


Pair = tuple[Features, dict[str, Any]]  # a sample's features and its logged figures


def fit_step(pairs: list[Pair]) -> dict[str, float]:
    """The step's factors on the H100 records whose phases the config has, then the H200's ratio."""
    rows, targets = [], []
    for f, logged in pairs:
        if f.gpu == "H100" and len(f.steps) == len(logged["ms_per_step"]):
            rows += [[*row, float(f.micro_steps)] for row in f.steps]
            targets += logged["ms_per_step"]
    coef = dict(zip((*STEP_TERMS, "step"), _nnls(rows, targets), strict=True)) | {"h200": 1.0}
    ratios = [
        ms / pred
        for f, logged in pairs
        if f.gpu == "H200" and len(f.steps) == len(logged["ms_per_step"])
        for ms, pred in zip(logged["ms_per_step"], predict_steps({"step": coef}, f), strict=True)
    ]
    coef["h200"] = statistics.median(ratios) / 1.0 if ratios else 1.0
    return coef


def fit_memory(pairs: list[Pair]) -> dict[str, float]:
    rows, targets = [], []
    for f, logged in pairs:
        if logged["peak_memory_bytes"]:
            rows.append([1.0, f.memory["states"], f.memory["activations"]])
            targets.append(logged["peak_memory_bytes"])
    return dict(zip(("base", "states", "activations"), _nnls(rows, targets), strict=True))


SYNTHETIC_VALUES = 2**17
SYNTHETIC_BITS, SYNTHETIC_CLIP = 6, 4.0


def synthetic_ratios() -> dict[str, float]:
    """Each installed compressor's bytes over the Gaussian entropy of int6 values clipped at 4 sigmas
    (one fixed seed): how the compressors compare where no record used one (pergroup needs lrzip and
    real tensors: left out)."""
    rng = np.random.default_rng(0)
    levels = 2 ** (SYNTHETIC_BITS - 1) - 1
    values = np.clip(
        np.round(rng.standard_normal(SYNTHETIC_VALUES) * levels / SYNTHETIC_CLIP), -levels, levels
    )
    data = values.astype(np.int8).tobytes()
    entropy = SYNTHETIC_VALUES * gaussian_bits(SYNTHETIC_BITS, SYNTHETIC_CLIP) / 8
    out = {}
    for name in compress.COMPRESSORS:
        if name in ("none", compress.PERGROUP):
            continue
        try:
            compress.check_available(name)
        except PgolfError:
            continue
        out[name] = round(len(compress.compress(data, name)) / entropy, 4)
    return out


def fit_bytes(pairs: list[Pair], synthetic: dict[str, float]) -> dict[str, Any]:
    """Per compressor the factor over the Gaussian entropy (the median of its records'), and per format the
    clip (in sigmas) the percentile search amounts to, chosen on a grid for the smallest mean error (a median
    would leave out the few records that search their clips). `synthetic`: the compressors' ratios on
    synthetic values, which price one no record used against brotli."""
    coef: dict[str, Any] = {"compressor": {}, "percentile_clip": {}, "synthetic": synthetic}
    for fmt in ("int8", "mixed"):
        group = [
            (f, logged["artifact_bytes"])
            for f, logged in pairs
            if f.quant_format == fmt and logged["artifact_bytes"]
        ]
        if not group:
            continue
        best: tuple[float, float, dict[str, float]] | None = None
        for clip in CLIP_GRID if any(f.percentile for f, _ in group) else [4.0]:
            ratios: dict[str, list[float]] = {}
            for f, size in group:
                ratios.setdefault(f.compressor, []).append((size - f.raw_bytes) / entropy_bytes(f, clip))
            factors = {k: statistics.median(v) for k, v in ratios.items()}
            error = statistics.mean(
                abs((factors[f.compressor] * entropy_bytes(f, clip) + f.raw_bytes) / size - 1)
                for f, size in group
            )
            if best is None or error < best[0] - 1e-12:
                best = (error, clip, factors)
        assert best is not None
        coef["percentile_clip"][fmt] = best[1]
        coef["compressor"] |= best[2]
    return coef


EVAL_TERMS = {
    "roundtrip": ("flops",),
    "sliding": ("flops",),
    "ttt_full": ("flops",),
    "ttt_lora": ("flops", "global"),
}


def fit_eval(pairs: list[Pair]) -> dict[str, Any]:
    """Per evaluation phase: a fixed cost and seconds per FLOP (a GPU's share); TTT by mode. A phase with
    too few records for a fixed cost is proportional to its work alone; with none it is left out."""
    rows: dict[str, tuple[list[list[float]], list[float]]] = {k: ([], []) for k in EVAL_TERMS}
    for f, logged in pairs:
        if f.gpu != "H100":
            continue
        for phase, work in f.eval.items():
            seconds = logged["eval_seconds"].get("ttt" if phase.startswith("ttt") else phase)
            if seconds:
                rows[phase][0].append([1.0] + [work[t] for t in EVAL_TERMS[phase]])
                rows[phase][1].append(seconds)
    coef: dict[str, Any] = {}
    for phase, (a, b) in rows.items():
        terms = ("base", *EVAL_TERMS[phase])
        if len(b) > len(terms):
            coef[phase] = dict(zip(terms, _nnls(a, b), strict=True))
        elif b:
            coef[phase] = {"base": 0.0} | dict(
                zip(EVAL_TERMS[phase], _nnls([r[1:] for r in a], b), strict=True)
            )
    return coef


def val_table(samples: list[dict[str, Any]]) -> dict[str, int]:
    """The validation tokens the records logged, by vocabulary (and CaseOps)."""
    out: dict[str, int] = {}
    for s in samples:
        cfg = sample_config(s)
        if s["logged"]["val_tokens"]:
            out[f"{cfg.vocab_size}{'+caseops' if cfg.caseops_enabled else ''}"] = int(
                s["logged"]["val_tokens"]
            )
    return dict(sorted(out.items()))


def fit(pairs: list[Pair], synthetic: dict[str, float]) -> dict[str, Any]:
    """Every coefficient of the plan, fitted on `pairs`."""
    return {
        "step": fit_step(pairs),
        "memory": fit_memory(pairs),
        "bytes": fit_bytes(pairs, synthetic),
        "eval": fit_eval(pairs),
    }


def predict(coef: dict[str, Any], f: Features) -> dict[str, Any]:
    """The plan's figures for a record's own settings and machine."""
    return {
        "ms_per_step": predict_steps(coef, f),
        "peak_memory_bytes": predict_memory(coef, f),
        "artifact_bytes": predict_bytes(coef, f)[0],
        "eval_seconds": predict_eval(coef, f),
    }


def errors(pred: dict[str, Any], logged: dict[str, Any]) -> dict[str, list[float]]:
    """Relative errors (predicted / logged - 1) by quantity: each phase's ms a step, the peak memory, the
    model's bytes, and the total time of the evaluation phases the log timed."""

    def rel(p: float, l_: float | None) -> list[float]:
        return [p / l_ - 1] if l_ and math.isfinite(p) else []

    out = {"ms_per_step": [], "memory": [], "bytes": [], "eval": []}
    if len(pred["ms_per_step"]) == len(logged["ms_per_step"]):
        for p, l_ in zip(pred["ms_per_step"], logged["ms_per_step"], strict=True):
            out["ms_per_step"] += rel(p, l_)
    out["memory"] += rel(pred["peak_memory_bytes"], logged["peak_memory_bytes"])
    out["bytes"] += rel(pred["artifact_bytes"], logged["artifact_bytes"])
    # The evaluation's total (what the limit is on): the phases the log timed, predicted and logged.
    shared = [p for p in logged["eval_seconds"] if p in pred["eval_seconds"]]
    if shared:
        out["eval"] += rel(
            sum(pred["eval_seconds"][p] for p in shared), sum(logged["eval_seconds"][p] for p in shared)
        )
    return out


def pairs_of(samples: list[dict[str, Any]]) -> list[Pair]:
    known = val_table(samples)
    return [(sample_features(s, known), s["logged"]) for s in samples]


def backtest(
    samples: list[dict[str, Any]], synthetic: dict[str, float], log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Each sample predicted by a fit on all the others: its rows and the summary by quantity (the median
    over records of each record's median |error|, and its 80th percentile, the band a plan shows)."""
    pairs = pairs_of(samples)
    rows = []
    for i, (sample, (f, logged)) in enumerate(zip(samples, pairs, strict=True)):
        pred = predict(fit(pairs[:i] + pairs[i + 1 :], synthetic), f)
        rows.append(
            {"record": sample["record"], "predicted": pred, "logged": logged, "errors": errors(pred, logged)}
        )
        if log:
            log(backtest_line(rows[-1]))
    summary = {}
    for q in QUANTITIES:
        per_record = [statistics.median(abs(e) for e in r["errors"][q]) for r in rows if r["errors"][q]]
        summary[q] = {
            "records": len(per_record),
            "median": statistics.median(per_record) if per_record else math.nan,
            "p80": float(np.percentile(per_record, 80)) if per_record else math.nan,
        }
    return {"rows": rows, "summary": summary}


def _pair(p: float, l_: float | None, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    if l_ is None:
        return f"{p / scale:,.{digits}f}{unit} (not logged)"
    return f"{p / scale:,.{digits}f}/{l_ / scale:,.{digits}f}{unit} ({100 * (p / l_ - 1):+.1f}%)"


def backtest_line(row: dict[str, Any]) -> str:
    """One record: predicted/logged ms a step per phase, memory, bytes, each evaluation phase."""
    p, g = row["predicted"], row["logged"]
    if len(p["ms_per_step"]) == len(g["ms_per_step"]):
        steps = ", ".join(_pair(a, b, " ms") for a, b in zip(p["ms_per_step"], g["ms_per_step"], strict=True))
    else:
        steps = "phases differ"
    ev = ", ".join(
        f"{k} {_pair(p['eval_seconds'][k], v, ' s')}"
        for k, v in g["eval_seconds"].items()
        if k in p["eval_seconds"]
    )
    return (
        f"{row['record']}: step {steps}; memory {_pair(p['peak_memory_bytes'], g['peak_memory_bytes'], ' GiB', 2**30)}; "
        f"bytes {_pair(p['artifact_bytes'], g['artifact_bytes'], ' MB', 1e6, 3)}; eval {ev or 'none logged'}"
    )


def summary_line(result: dict[str, Any]) -> str:
    """The backtest's last line: how many records, and per quantity the median over records of |error|."""
    s = result["summary"]
    return (
        f"backtest: {len(result['rows'])} records, ms/step median |error| {100 * s['ms_per_step']['median']:.1f}%, "
        f"memory {100 * s['memory']['median']:.1f}%, bytes {100 * s['bytes']['median']:.1f}%, "
        f"eval {100 * s['eval']['median']:.1f}%"
    )


def summary_line_of(table: dict[str, Any]) -> str:
    """A fitted table's backtest summary, as `summary_line` printed it."""
    return summary_line({"rows": table["samples"], "summary": table["backtest"]})


def refit_without(table: dict[str, Any], text: str) -> dict[str, Any]:
    """The table refitted on its samples whose record name does not contain `text` (bands kept)."""
    kept = [s for s in table["samples"] if text not in s["record"]]
    if len(kept) == len(table["samples"]):
        raise PgolfError(f"plan --without {text!r}: no record of the table has that in its name")
    if not kept:
        raise PgolfError(f"plan --without {text!r}: that leaves no record to fit on")
    coefficients = fit(pairs_of(kept), table["coefficients"]["bytes"]["synthetic"])
    return table | {"coefficients": coefficients, "val_tokens": val_table(kept) or table["val_tokens"]}


def make_table(samples: list[dict[str, Any]], left_out: list[dict[str, str]], source: str) -> dict[str, Any]:
    """The fitted table: coefficients on every sample, the backtest's bands, the samples themselves."""
    synthetic = synthetic_ratios()
    result = backtest(samples, synthetic)
    return {
        "source": source,
        "coefficients": fit(pairs_of(samples), synthetic),
        "bands": {q: round(v["p80"], 4) for q, v in result["summary"].items() if math.isfinite(v["p80"])},
        "backtest": {
            q: {k: round(x, 6) if isinstance(x, float) else x for k, x in v.items()}
            for q, v in result["summary"].items()
        },
        "val_tokens": val_table(samples),
        "implementation": {"records": 1.0, "pgolf": None},
        "samples": samples,
        "left_out": left_out,
    }
