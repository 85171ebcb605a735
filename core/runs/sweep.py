"""A sweep: variants of one config x seeds, each an ordinary training run, ranked with significance.

A sweep spec is a TOML file:

    name = "ablation_tiny"      # the runs' names start with it (default: the file's name)
    preset = "tiny"             # the base config: a preset, and/or
    config = "base.toml"        #   a config file (relative to the spec), over the preset
    backend = "cuda"            # cuda, mlx or auto (default auto)
    seeds = [1, 2, 3]
    parallel = 2                # runs at once, each its own process (default 1)
    out_dir = "runs"            # where the run directories go (default: the base config's)
    margin_nats = 0.005         # also test "better than the base by this much" (default: not)
    record = "records/track_10min_16mb/2026-04-01_Vocab4096_MLPMult4_WD085"  # compare with a record's
                                #   seeds instead of the base variant's (a records folder)

    [base]                      # config fields over the preset, for every run
    iterations = 200

    [grid]                      # every combination of these values ...
    matrix_lr = [0.02, 0.04]

    [[variants]]                # ... or named variants, each its own settings
    name = "mlp3"
    mlp_mult = 3.0

The base config is itself a variant, "base": the grid point (or the variant) whose config is the
base's, else one added first. Each (variant, seed) is the run `<name>-<variant>-seed<seed>` under
out_dir, in the run group `<name>-<variant>` (so `cli.py runs` shows each variant's seeds as a group,
and `runs --compare` tests two of them). A run's folder also holds what the sweep gave it:
sweep_config.json (its config, the `train --config` of its first start), sweep.log (its output) and,
when it failed, sweep_failed.txt (its error line).

This module parses and checks the spec, plans the runs, tells where each run stands, and writes the
report; cli.py starts the runs.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError, did_you_mean
from core.common.files import WriterLock, json_text, open_regular, parse_toml, read_text, write_atomic
from core.config.fields import SEED_MAX, Config, env_names, field_names
from core.config.presets import PRESETS
from core.config.sources import read_run_config, resolve
from core.model.backend import ALIASES, CHOICES
from core.runs.plan import target_summary
from core.runs.plots import plot_sweep
from core.runs.record_folder import seed_figures
from core.runs.stats import mean_std, welch
from core.runs.summary import read_metrics, summarize
from core.train.rundir import config_digest

SPEC_KEYS = ("name", "preset", "config", "backend", "seeds", "parallel", "out_dir", "margin_nats", "record",
             "base", "grid", "variants")  # fmt: skip
# Fields the sweep sets itself for each run.
SWEEP_FIELDS = ("seed", "run_id", "run_group", "out_dir")
BASE = "base"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+-]*")
MAX_SPEC_BYTES = 2**20
MAX_FAILURE_BYTES = 2**16  # what is read of a failed run's error line and output
# The most runs (variants x seeds) one spec may plan: counted before the grid is expanded, so a typo'd
# grid is one line, not a machine out of memory. Far more than a sweep trains in a week.
MAX_RUNS = 10_000
CONFIG_FILE = "sweep_config.json"
LOG_FILE = "sweep.log"
FAILED_FILE = "sweep_failed.txt"


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict[str, Any]  # the fields it changes from the base config
    cfg: Config  # the base config with them (seed, run_id, run_group and out_dir not yet set)


@dataclass(frozen=True)
class PlannedRun:
    variant: str
    seed: int
    cfg: Config  # what it trains with

    @property
    def run_id(self) -> str:
        return self.cfg.run_id

    @property
    def path(self) -> Path:
        return Path(self.cfg.out_dir) / self.cfg.run_id


@dataclass(frozen=True)
class Sweep:
    spec: Path
    name: str
    preset: str
    backend: str
    seeds: list[int]
    parallel: int
    margin_nats: float
    base: Variant
    variants: list[Variant]  # the base first
    runs: list[PlannedRun] = field(default_factory=list)  # variant by variant, seed by seed
    record: Path | None = None  # a records folder: the variants are compared with its seeds

    def report_path(self, suffix: str) -> Path:
        """Where the report goes: beside the spec (<spec>.report.md, .json, .png)."""
        return self.spec.with_suffix(f".report{suffix}")


# ------------------------------------------------------------------------ spec
def load_sweep(spec: str | Path, environ: dict[str, str] | None = None) -> Sweep:
    """The sweep a spec file describes, every variant's config checked; one-line errors naming the spec."""
    spec = Path(spec)
    where = f"sweep spec {spec}"
    data = parse_toml(read_text(spec, "sweep spec", MAX_SPEC_BYTES), where)
    for key in data:
        if key not in SPEC_KEYS:
            raise PgolfError(f"{where}: unknown key {key!r}{did_you_mean(key, SPEC_KEYS)}")

    name = _text(data, "name", spec.stem, where)
    if not NAME.fullmatch(name):
        raise PgolfError(f"{where}: name {name!r} must be letters, digits and . _ = , + - (a folder name)")
    preset = _text(data, "preset", "baseline", where)
    if preset not in PRESETS:
        raise PgolfError(f"{where}: unknown preset {preset!r}{did_you_mean(preset, PRESETS)}")
    config = data.get("config")
    if config is not None and not isinstance(config, str):
        raise PgolfError(f"{where}: config must be the path of a config file, got {config!r}")
    config_path = None if config is None else spec.parent / config
    backend = _text(data, "backend", "auto", where)
    if ALIASES.get(backend, backend) not in CHOICES:
        raise PgolfError(
            f"{where}: backend = {backend!r}{did_you_mean(backend, CHOICES)} (choose from {', '.join(CHOICES)})"
        )
    seeds = data.get("seeds", [1337])
    if (
        not isinstance(seeds, list) or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) != len(seeds)
    ):  # fmt: skip
        raise PgolfError(f"{where}: seeds must be a list of distinct whole numbers, got {seeds!r}")
    bad_seed = next((s for s in seeds if not 0 <= s <= SEED_MAX), None)
    if bad_seed is not None:
        raise PgolfError(f"{where}: seeds = {seeds!r}: seed {bad_seed} is not in 0..{SEED_MAX} (2^32 - 1)")
    parallel = data.get("parallel", 1)
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise PgolfError(f"{where}: parallel must be a whole number >= 1, got {parallel!r}")
    margin = data.get("margin_nats", 0.0)
    if not isinstance(margin, int | float) or isinstance(margin, bool) or not 0 <= margin < math.inf:
        raise PgolfError(f"{where}: margin_nats must be a number >= 0, got {margin!r}")

    record = data.get("record")
    if record is not None and not (isinstance(record, str) and (spec.parent / record).is_dir()):
        raise PgolfError(f"{where}: record must be the path of a records folder, got {record!r}")
    base_settings = _settings(data.get("base", {}), f"{where}: [base]")
    try:
        base_cfg = resolve(preset, config_path, base_settings, environ)
    except PgolfError as exc:
        raise PgolfError(f"{where}: the base config: {str(exc).removeprefix('config: ')}") from None
    out_dir = _text(data, "out_dir", base_cfg.out_dir, where)
    try:
        base_cfg.validate()
    except PgolfError as exc:
        raise PgolfError(f"{where}: the base config: {exc}") from None

    variants = [
        Variant(label, settings, _variant_config(base_cfg, settings, f"{where}: variant {label!r}"))
        for label, settings in _variant_settings(data, where, len(seeds))
    ]
    base = next((v for v in variants if v.cfg == base_cfg), None)
    if base is None:
        if any(v.name == BASE for v in variants):
            raise PgolfError(
                f"{where}: the variant named {BASE!r} changes the base config: name it otherwise"
            )
        base = Variant(BASE, {}, base_cfg)
        variants.insert(0, base)
    else:
        variants.remove(base)
        variants.insert(0, base)
    _check_environment(environ, {"seed", "run_id", "run_group", *base_settings, *(k for v in variants for k in v.settings),
                                 *(["out_dir"] if "out_dir" in data else [])}, where)  # fmt: skip
    sweep = Sweep(spec, name, preset, backend, seeds, parallel, float(margin), base, variants,
                  record=None if record is None else spec.parent / record)  # fmt: skip
    for v in variants:
        group = f"{name}-{v.name}"
        for seed in seeds:
            cfg = v.cfg.replace(seed=seed, run_group=group, run_id=f"{group}-seed{seed}", out_dir=out_dir)
            sweep.runs.append(
                PlannedRun(v.name, seed, _variant_config(cfg, {}, f"{where}: run {cfg.run_id}"))
            )
    return sweep


def _text(data: dict[str, Any], key: str, default: str, where: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise PgolfError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _settings(table: Any, where: str) -> dict[str, Any]:
    """A table of config fields: known names, one value each, none the sweep sets itself."""
    if not isinstance(table, dict):
        raise PgolfError(f"{where} must be a table of config fields")
    for key, value in table.items():
        if key not in field_names():
            raise PgolfError(f"{where}: unknown config field {key!r}{did_you_mean(key, field_names())}")
        if key in SWEEP_FIELDS:
            raise PgolfError(f"{where}: {key} is set by the sweep (seeds, name and out_dir at the top)")
        if isinstance(value, dict | list):
            raise PgolfError(f"{where}: {key} must be one value, not a table or a list")
    return dict(table)


def _variant_settings(data: dict[str, Any], where: str, seeds: int) -> list[tuple[str, dict[str, Any]]]:
    """(name, settings) of each variant: the [grid]'s combinations, or the [[variants]]; refused when the
    variants times `seeds` are more than MAX_RUNS runs (counted before the grid is expanded)."""
    grid, listed = data.get("grid"), data.get("variants")
    if (grid is None) == (listed is None):
        both = "both" if grid is not None else "neither"
        raise PgolfError(f"{where}: give either a [grid] of settings or a list of [[variants]], not {both}")
    found: list[tuple[str, dict[str, Any]]] = []
    if grid is not None:
        if not isinstance(grid, dict) or not grid:
            raise PgolfError(f"{where}: [grid] must be a table of config fields, each a list of values")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise PgolfError(f"{where}: [grid] {key} must be a non-empty list of values, got {values!r}")
            for value in values:
                _settings({key: value}, f"{where}: [grid]")
            shown: set[str] = set()
            for value in map(repr, values):
                if value in shown:
                    raise PgolfError(f"{where}: [grid] {key} lists a value twice: {value}")
                shown.add(value)
        _check_run_count(math.prod(len(v) for v in grid.values()), seeds, f"{where}: [grid]")
        keys = list(grid)
        for combo in itertools.product(*(grid[k] for k in keys)):
            settings = dict(zip(keys, combo, strict=True))
            label = ",".join(f"{k}={_shown(v)}" for k, v in settings.items())
            found.append((re.sub(r"[^A-Za-z0-9._=,+-]", "_", label), settings))
    else:
        if not isinstance(listed, list) or not listed or not all(isinstance(v, dict) for v in listed):
            raise PgolfError(f"{where}: variants must be a list of tables ([[variants]]), each with a name")
        _check_run_count(len(listed), seeds, f"{where}: [[variants]]")
        for number, table in enumerate(listed, 1):
            label = table.get("name")
            if not isinstance(label, str) or not NAME.fullmatch(label):
                raise PgolfError(
                    f"{where}: variant {number} needs a name of letters, digits and . _ = , + -, got {label!r}"
                )
            settings = {k: v for k, v in table.items() if k != "name"}
            found.append((label, _settings(settings, f"{where}: variant {label!r}")))
    seen: set[str] = set()
    for label, _ in found:
        if label in seen:
            raise PgolfError(f"{where}: two variants are named {label!r}")
        seen.add(label)
    return found


def _check_run_count(variants: int, seeds: int, where: str) -> None:
    if variants * seeds > MAX_RUNS:
        raise PgolfError(
            f"{where} makes {variants:,} variants x {seeds} seeds = {variants * seeds:,} runs, more than a "
            f"sweep may plan ({MAX_RUNS:,}): split it into smaller sweeps"
        )


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _variant_config(base: Config, settings: dict[str, Any], where: str) -> Config:
    try:
        return base.replace(**settings).validate()
    except PgolfError as exc:
        raise PgolfError(f"{where}: {str(exc).removeprefix('config: ')}") from None


# ------------------------------------------------------------- the runs' environment
def _check_environment(environ: dict[str, str] | None, spec_sets: set[str], where: str) -> None:
    """Refuse an environment variable for a field the spec sets itself (MATRIX_LR where a variant sets
    matrix_lr, SEED where the sweep sets each run's): which would win is no question to leave open."""
    for name, var in sorted(env_names(environ).items()):
        if name in spec_sets:
            value = (os.environ if environ is None else environ)[var]
            raise PgolfError(f"{where} sets {name} itself: unset {var} (it is {value!r} in the environment)")


def child_environ(environ: dict[str, str]) -> dict[str, str]:
    """The environment a run of the sweep starts with: `environ` without the variables that set config
    fields (MATRIX_LR, SEED, ...). A run's whole config is its sweep_config.json, which holds the values
    such variables gave the base config where the spec sets nothing: the spec wins where it does."""
    dropped = set(env_names(environ).values())
    return {k: v for k, v in environ.items() if k not in dropped}


# ------------------------------------------------------------------ run states
DONE, FAILED, RESUME, NEW = "done", "failed", "resume", "new"
BEHIND = "behind"  # stopped by itself behind its abort_behind reference: not a failure, not resumed
UNKNOWN = "unknown"  # in the report: a finished run whose config is not known to be the spec's
# The files of a run folder the sweep reads or resumes from (besides final_model.* and checkpoints/*).
RUN_FILES = ("config.json", "metrics.jsonl", "train.log", CONFIG_FILE, LOG_FILE, FAILED_FILE)


def run_state(run: PlannedRun) -> str:
    """Where a planned run stands: done (its final score is in its folder), behind (it stopped behind its
    abort_behind reference), failed (the sweep saw it fail), resume (it has a checkpoint), or new
    (nothing usable: start it afresh, its folder emptied).

    A folder that holds what the sweep did not write, or one trained with other settings than the
    spec now gives, is refused by name; so is one that a process is writing now."""
    path = run.path
    if not path.exists():
        return NEW
    if not path.is_dir() or (not (path / CONFIG_FILE).exists() and any(path.iterdir())):
        raise PgolfError(f"{path} holds what this sweep did not write: move it, or rename the sweep")
    check_run_files(path)
    _check_free(path)
    summary = summarize(path) if (path / "metrics.jsonl").is_file() else None
    if summary is not None and (summary.finished or summary.stopped):
        _check_same_settings(run)
        return DONE if summary.finished else BEHIND
    if (path / FAILED_FILE).exists():
        return FAILED
    if any((path / "checkpoints").glob("step_*.safetensors")):
        _check_same_settings(run)
        return RESUME
    return NEW


def _check_free(path: Path) -> None:
    """Refuse a run folder that a process is writing (a sweep already running, or a `train`)."""
    with WriterLock(path, "run directory"):
        pass


def check_run_files(path: Path) -> None:
    """Each file of a run folder the sweep reads is a regular file (a FIFO would block the reader, and a
    run resumed from one would hang): else a PgolfError naming it."""
    found = [path / name for name in RUN_FILES] + sorted(path.glob("final_model.*"))
    checkpoints = path / "checkpoints"
    if checkpoints.is_dir():
        found += sorted(checkpoints.iterdir())
    elif os.path.lexists(checkpoints):
        found.append(checkpoints)
    for entry in found:
        if os.path.lexists(entry) and not entry.is_file():
            raise PgolfError(
                f"{entry} is not a regular file (a folder, a FIFO, a device or a broken link): "
                "the sweep neither reads nor resumes it: remove it, or the run"
            )


def trained_with(path: Path) -> dict[str, Any] | str:
    """The config a run trained with: its config.json, which must be the one its last start logged (by
    digest, in metrics.jsonl beside its scores); else why that is unknown (a config.json lost, damaged
    or edited since)."""
    try:
        saved = read_run_config(path / "config.json")
    except PgolfError:
        return "its config.json is missing, unreadable or not a table of settings: what it trained with is unknown"
    try:
        starts = [r for r in read_metrics(path) if r.get("kind") == "start"]
    except PgolfError:
        starts = []
    logged = starts[-1].get("config_sha256") if starts else None  # (runs before the digest: none)
    if logged is not None and logged != config_digest(saved):
        return "its config.json is not the config it trained with (changed since): what it trained with is unknown"
    return saved


def settings_differ(run: PlannedRun) -> str:
    """Why a run's folder is not the run the spec now plans: its config unknown, or a setting that differs
    (a spec edited after some runs finished would otherwise mix two experiments in one table); '' if none."""
    saved = trained_with(run.path)
    if isinstance(saved, str):
        return saved
    try:
        given = Config.from_dict(saved)
    except (PgolfError, TypeError, ValueError):
        return "its config.json holds settings pgolf cannot read: what it trained with is unknown"
    for name in sorted(field_names() - {"out_dir"}):
        if getattr(given, name) != getattr(run.cfg, name):
            return f"it was trained with {name}={getattr(given, name)!r}, the spec now gives {getattr(run.cfg, name)!r}"
    return ""


def _check_same_settings(run: PlannedRun) -> None:
    """A run is done or resumed only when it is the run the spec plans; else refused by name."""
    why = settings_differ(run)
    if why:
        raise PgolfError(f"{run.path}: {why}: remove the run, or rename the sweep")


def failure(path: Path) -> str:
    """The error line a failed run ended with (its sweep_failed.txt), or ''."""
    if not (path / FAILED_FILE).exists():
        return ""
    try:
        return read_text(path / FAILED_FILE, "failure record", MAX_FAILURE_BYTES).strip()
    except PgolfError as exc:  # a failure record that is no text: what is wrong with it, in its place
        return str(exc)


def last_error_line(log: Path) -> str:
    """The line a failed run's output ended with: its last `error:` line, else its last line."""
    try:  # its last MAX_FAILURE_BYTES: a failed run's output can be long
        with open_regular(log, "run output") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_FAILURE_BYTES))
            lines = [line.strip() for line in f.read().decode("utf-8", errors="replace").splitlines()]
    except PgolfError:
        return "no output"
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith(("error:", "[rank"))]
    return (errors or lines or ["no output"])[-1]


def run_step(path: Path) -> int:
    """The last optimizer step a run has logged (0 when none yet)."""
    try:
        records = read_metrics(path)
    except PgolfError:
        return 0
    return max((int(r["step"]) for r in records if r["kind"] in ("train", "val")), default=0)


# ---------------------------------------------------------------------- report
@dataclass
class Row:
    """One variant's line of the report."""

    variant: str
    settings: dict[str, Any]
    seeds: list[int]  # of its finished runs
    val_bpb: list[float]
    val_loss: list[float]
    mean_bpb: float = math.nan
    std_bpb: float = math.nan
    mean_loss: float = math.nan
    std_loss: float = math.nan
    diff_nats: float = math.nan  # mean val_loss minus the base's: below 0 is better
    diff_bpb: float = math.nan
    p: float | None = None  # Welch's one-sided p that it is no better than the base
    p_margin: float | None = None  # ... no better by margin_nats
    plan: dict[str, Any] = field(default_factory=dict)  # its config planned on 8xH100 (core.runs.plan)


def report(sweep: Sweep) -> dict[str, Any]:
    """The sweep's results: each variant's finished runs (mean ± std of the final score, the difference
    from the base, Welch's p against it), ranked by mean val_bpb; and the runs that did not finish.

    The score is a run's final figure: sliding-window where it was evaluated so, else the artifact
    round trip's (core.runs.summary)."""
    rows: dict[str, Row] = {
        v.name: Row(v.name, v.settings, [], [], [], plan=target_summary(v.cfg)) for v in sweep.variants
    }
    missing = []
    for run in sweep.runs:
        try:
            if run.path.is_dir():
                check_run_files(run.path)
            summary = summarize(run.path) if (run.path / "metrics.jsonl").is_file() else None
            why = settings_differ(run) if summary is not None and summary.finished else ""
        except PgolfError as exc:
            summary, why = None, str(exc)
        if why:  # not counted under a variant it may not have trained with
            missing.append({"run": run.run_id, "variant": run.variant, "seed": run.seed, "state": UNKNOWN,
                            "step": 0, "error": why})  # fmt: skip
            continue
        finite = summary is not None and all(
            map(math.isfinite, (summary.score_val_loss, summary.score_val_bpb))
        )
        if summary is not None and summary.finished and finite:
            row = rows[run.variant]
            row.seeds.append(run.seed)
            row.val_bpb.append(summary.score_val_bpb)
            row.val_loss.append(summary.score_val_loss)
            continue
        error = failure(run.path)
        if summary is not None and summary.finished:  # finished, its score not finite
            state, error = "diverged", error or "its final score is not finite"
        elif summary is not None and summary.stopped:
            state, error = BEHIND, f"stopped {summary.stopped}"
        elif error:
            state = "diverged" if "diverged" in error else "failed"
        else:
            state = "unfinished" if summary is not None else "not started"
        missing.append({"run": run.run_id, "variant": run.variant, "seed": run.seed, "state": state,
                        "step": run_step(run.path) if summary else 0, "error": error})  # fmt: skip
    base = rows[sweep.base.name]
    against = base.variant
    if sweep.record is not None:  # every variant, the base config's too, against the record's seeds
        record_seeds, loss, bpb = seed_figures(sweep.record)
        base = Row(
            f"record {sweep.record.name}", {}, [int(s) if s.isdigit() else s for s in record_seeds], bpb, loss
        )
        against = f"the record {sweep.record} (seeds {', '.join(record_seeds)})"
    for row in rows.values():
        if not row.val_bpb:
            continue
        row.mean_bpb, row.std_bpb = mean_std(row.val_bpb)
        row.mean_loss, row.std_loss = mean_std(row.val_loss)
        if base.val_loss:
            row.diff_nats = row.mean_loss - mean_std(base.val_loss)[0]
            row.diff_bpb = row.mean_bpb - mean_std(base.val_bpb)[0]
        if row is not base and len(row.val_loss) >= 2 and len(base.val_loss) >= 2:
            row.p = welch(base.val_loss, row.val_loss).p
            if sweep.margin_nats > 0:
                row.p_margin = welch(base.val_loss, row.val_loss, sweep.margin_nats).p
    ranked = sorted(rows.values(), key=lambda r: (not r.val_bpb, r.mean_bpb if r.val_bpb else 0.0))
    return {
        "sweep": sweep.name,
        "spec": str(sweep.spec),
        "preset": sweep.preset,
        "backend": sweep.backend,
        "seeds": sweep.seeds,
        "base": sweep.base.name,
        "compared_with": against,
        "margin_nats": sweep.margin_nats,
        "runs": len(sweep.runs),
        "finished": sum(len(r.val_bpb) for r in rows.values()),
        "variants": [_row_dict(r) for r in ranked],
        "not_finished": missing,
    }


def _row_dict(row: Row) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in vars(row).items()}


def markdown(result: dict[str, Any], command: str = "") -> str:
    """The report as markdown: the ranked table, then the runs that did not finish."""

    def num(value: float | None, digits: int = 4, sign: bool = False) -> str:
        if value is None:
            return "–"
        return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"

    def p_value(value: float | None) -> str:
        return "–" if value is None else f"{value:.3g}"

    margin = result["margin_nats"]
    lines = [
        f"# Sweep {result['sweep']}",
        "",
        f"{result['finished']} of {result['runs']} runs finished; preset {result['preset']}, backend "
        f"{result['backend']}, seeds {', '.join(map(str, result['seeds']))}. Ranked by mean final val_bpb "
        f"(± the standard deviation over seeds); Δ is the variant's mean minus that of "
        f"{result.get('compared_with', result['base'])}, "
        "below 0 is better; p is Welch's one-sided p-value that the variant's val_loss is no lower than the "
        "reference's" + (f"; p (margin) that it is not lower by {margin} nats" if margin else "") + ". "
        "The 8xH100 columns are `cli.py plan`'s prediction for the variant's config there, with the records' "
        "training code: ms a step (per phase), steps in the wallclock cap, artifact + code bytes, the verdict.",
        "",
    ]
    if command:
        lines[-1:-1] = ["", f"`{command}`"]
    header = ["rank", "variant", "settings", "runs", "val_bpb", "val_loss", "Δ val_bpb", "Δ nats", "p"]
    if margin:
        header.append("p (margin)")
    header += ["8xH100 ms/step", "8xH100 steps", "8xH100 bytes", "8xH100 verdict"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for rank, row in enumerate(result["variants"], 1):
        settings = ", ".join(f"{k}={_shown(v)}" for k, v in row["settings"].items()) or "(base config)"
        if not row["val_bpb"]:
            cells = [str(rank), row["variant"], settings, "0"] + ["–"] * (len(header) - 8)
        else:
            spread = "" if row["std_bpb"] is None else f" ± {row['std_bpb']:.4f}"
            loss_spread = "" if row["std_loss"] is None else f" ± {row['std_loss']:.4f}"
            cells = [str(rank), row["variant"], settings, str(len(row["val_bpb"])),
                     f"{row['mean_bpb']:.4f}{spread}", f"{row['mean_loss']:.4f}{loss_spread}",
                     num(row["diff_bpb"], sign=True), num(row["diff_nats"], sign=True), p_value(row["p"])]  # fmt: skip
            if margin:
                cells.append(p_value(row["p_margin"]))
        lines.append("| " + " | ".join(cells + plan_cells(row.get("plan") or {})) + " |")
    if result["not_finished"]:
        lines += ["", "Runs without a final score:", ""]
        for m in result["not_finished"]:
            where = f" at step {m['step']}" if m["step"] else ""
            error = f": {m['error']}" if m["error"] else ""
            lines.append(f"- {m['run']} ({m['variant']}, seed {m['seed']}): {m['state']}{where}{error}")
    return "\n".join(lines) + "\n"


def plan_cells(plan: dict[str, Any]) -> list[str]:
    """A variant's plan on 8xH100: ms a step (per phase), steps in the cap, artifact + code bytes, the verdict
    (in bold where it breaks a limit there)."""
    if not plan:
        return ["–"] * 4
    verdict = plan["verdict"].replace("|", "/")
    return [
        "/".join(f"{m:.1f}" for m in plan["ms_per_step"]) or "–",
        "–" if plan["steps"] is None else f"{plan['steps']:,}",
        "–" if plan["bytes"] is None else f"{plan['bytes']:,}",
        f"**{verdict}**" if plan["breaks"] else verdict,
    ]


def write_report(sweep: Sweep, command: str = "") -> tuple[dict[str, Any], list[Path], str]:
    """Write <spec>.report.json, .md and .png beside the spec; return the report, the files, and why
    the plot was not drawn ('' when it was: it needs matplotlib, the table does not)."""
    result = report(sweep)
    if not result["finished"]:
        raise PgolfError(f"sweep {sweep.name}: no run has finished yet (cli.py sweep {sweep.spec} runs them)")
    paths = [
        write_atomic(sweep.report_path(".json"), (json_text(result, indent=2) + "\n").encode()),
        write_atomic(sweep.report_path(".md"), markdown(result, command).encode()),
    ]
    curves = {run.variant: [] for run in sweep.runs}
    for run in sweep.runs:
        if (run.path / "metrics.jsonl").is_file():
            curves[run.variant].append(run.path)
    try:
        paths.append(plot_sweep(result, curves, sweep.report_path(".png")))
    except PgolfError as exc:
        return result, paths, f"no plot: {exc}"
    return result, paths, ""
