"""A run directory read back: its checkpoints and artifact, its metrics, a summary per run.

core/train/rundir.py writes it (its files are listed there). Nothing here needs the framework
that trained the run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.common.files import parse_json, read_file
from core.config.fields import BUDGET_BYTES
from core.config.sources import read_run_config

MAX_METRICS_BYTES = 2**30  # a run's metrics log: a record per logged step, ~300 bytes each
# The fields each kind of record must hold as numbers (other kinds are kept as they are).
NUMERIC_FIELDS = {
    "train": ("step", "train_time_ms", "train_loss"),
    "val": ("step", "train_time_ms", "val_bpb"),
    "final": ("steps", "train_time_ms", "roundtrip_val_bpb", "artifact_bytes", "code_bytes"),
}
# Of those, the counts and times, which must be finite (a diverged run's loss or score may be NaN).
FINITE_FIELDS = ("step", "steps", "train_time_ms", "artifact_bytes", "code_bytes")


def newest_checkpoint(path: str | Path) -> Path:
    """`path` itself, or the checkpoint of the highest step under a run directory."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise PgolfError(f"{path}: no such checkpoint or run directory")
        return path
    found = [(int(p.stem.removeprefix("step_")), p) for p in (path / "checkpoints").glob("step_*.safetensors")
             if p.stem.removeprefix("step_").isdigit()]  # fmt: skip
    if not found:
        raise PgolfError(f"{path}: a run directory with no checkpoint in {path / 'checkpoints'}")
    return max(found)[1]


def weights_in(path: str | Path) -> Path:
    """`path` itself, or for a run directory its artifact (final_model.<label>.pgolf), else its newest
    checkpoint."""
    path = Path(path)
    if not path.exists():
        raise PgolfError(f"{path}: no such file or run directory")
    if path.is_dir():
        artifacts = sorted(path.glob("final_model.*.pgolf"), key=lambda p: p.stat().st_mtime)
        if artifacts:
            return artifacts[-1]
    return newest_checkpoint(path)


def run_of_checkpoint(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint was written into (…/RUN/checkpoints/step_N.safetensors), if any."""
    run = checkpoint.resolve().parent.parent
    return run if checkpoint.parent.name == "checkpoints" and (run / "config.json").is_file() else None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (path = the run directory or the file).

    A run killed while writing can leave its last line cut short (no newline after it, maybe in the
    middle of a character): that line is skipped. Damage anywhere else is an error naming the line,
    as is JSON the guarded parser refuses (nesting, huge integers, NaN: core/common/files.py).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    pieces = read_file(p, "metrics log", MAX_METRICS_BYTES).split(b"\n")  # a regular file only: never a FIFO
    records = []
    for number, raw in enumerate(pieces, 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            record = parse_json(line, f"{p}:{number}", finite=False)  # a diverged run's NaN is a figure
        except (UnicodeDecodeError, PgolfError) as exc:
            if number == len(pieces):  # the last line, cut short by a killed writer
                break
            if isinstance(exc, PgolfError):
                raise
            raise PgolfError(f"{p}:{number}: not UTF-8 text") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise PgolfError(f"{p}:{number}: a record needs a 'kind'")
        for key in NUMERIC_FIELDS.get(record["kind"], ()):
            value = record.get(key)
            finite = key not in FINITE_FIELDS or (isinstance(value, float | int) and math.isfinite(value))
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not finite:
                kind = "a finite number" if key in FINITE_FIELDS else "a number"
                raise PgolfError(
                    f"{p}:{number}: a {record['kind']} record needs {kind} '{key}', got {value!r}"
                )
        records.append(record)
    return records


@dataclass
class RunSummary:
    """Where a run got to: its last figures, and its final ones when it finished."""

    name: str
    path: Path
    model: str  # "layers x dim, vocab V"
    backend: str  # the backend of its last start ("?" for runs written before it was recorded)
    seed: int | None
    dataset: str
    steps: int  # optimizer steps logged so far (the final count when finished)
    train_time_ms: float
    val_bpb: float  # the last validation before quantization (nan if none yet)
    roundtrip_val_bpb: float  # the score after the int8 round trip (nan until finished)
    total_bytes: int | None  # artifact + code, when finished
    finished: bool
    artifact_bytes: int | None = None  # the artifact alone, when finished
    group: str = ""  # the config's run_group
    score_val_loss: float = math.nan  # the run's figure: sliding-window when scored so, else the round trip's
    score_val_bpb: float = math.nan
    stopped: str = ""  # why a run stopped before its end, when it did so by itself (abort_behind)
    budget_bytes: int = BUDGET_BYTES  # the cap on total_bytes it ran under
    eval_time_s: float = math.nan  # the final evaluation's wall time, reading the artifact included
    eval_phase_s: dict[str, float] = field(default_factory=dict)  # each evaluation's: roundtrip, sliding, ttt
    hardware: str = "?"  # of its last start: "8xNVIDIA H100 80GB HBM3", "CPU"
    train_tokens: int = 0  # the training tokens its steps read
    data: dict[str, Any] | None = None  # the digests of its data (core/data/provenance.py), when recorded

    @property
    def over_budget(self) -> bool:
        return self.total_bytes is not None and self.total_bytes > self.budget_bytes


def summarize(run_dir: str | Path) -> RunSummary:
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    try:  # a summary without the config when it is lost or damaged (the sweep's report says which)
        cfg = read_run_config(run_dir / "config.json")
    except PgolfError:
        cfg = {}
    try:
        model = f"{cfg['num_layers']}x{cfg['model_dim']}, vocab {cfg['vocab_size']}"
    except KeyError:
        model = "?"
    start = next((r for r in reversed(records) if r["kind"] == "start"), {})
    data = next((r for r in reversed(records) if r["kind"] == "data"), None)
    seed = cfg.get("seed")
    final = next((r for r in reversed(records) if r["kind"] == "final"), None)
    vals = [r for r in records if r["kind"] == "val"]
    last_start = max((i for i, r in enumerate(records) if r["kind"] == "start"), default=-1)
    stop = next((r for r in records[last_start + 1 :] if r["kind"] == "stopped"), None)
    timed = [r for r in records if r["kind"] in ("train", "val")]
    return RunSummary(
        name=run_dir.name,
        path=run_dir,
        model=model,
        backend=str(start.get("backend", "?")),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        dataset=str(cfg.get("dataset") or Path(str(cfg.get("data_path", "?"))).name),
        steps=int(final["steps"]) if final else max((int(r["step"]) for r in timed), default=0),
        train_time_ms=float(final["train_time_ms"])
        if final
        else max((float(r["train_time_ms"]) for r in timed), default=0.0),
        val_bpb=float(vals[-1]["val_bpb"]) if vals else math.nan,
        roundtrip_val_bpb=float(final["roundtrip_val_bpb"]) if final else math.nan,
        total_bytes=int(final["artifact_bytes"]) + int(final["code_bytes"]) if final else None,
        finished=final is not None,
        artifact_bytes=int(final["artifact_bytes"]) if final else None,
        group=str(cfg.get("run_group") or ""),
        score_val_loss=_score(final, "val_loss"),
        score_val_bpb=_score(final, "val_bpb"),
        budget_bytes=_whole(cfg, "budget_bytes") or BUDGET_BYTES,
        eval_time_s=_number(final, "eval_time_s"),
        eval_phase_s={
            phase: _number(final, f"{phase}_eval_s")
            for phase in ("roundtrip", "sliding", "ttt")
            if not math.isnan(_number(final, f"{phase}_eval_s"))
        },
        hardware=hardware(start),
        train_tokens=(int(final["steps"]) if final else 0) * (_whole(cfg, "train_batch_tokens") or 0),
        data={k: v for k, v in data.items() if k != "kind"} if data else None,
        stopped="" if stop is None or final else str(stop.get("why", "stopped")),
    )


def _number(record: dict[str, Any] | None, name: str) -> float:
    value = (record or {}).get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _whole(record: dict[str, Any] | None, name: str) -> int | None:
    value = (record or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hardware(start: dict[str, Any]) -> str:
    """What a run's start record says it ran on: the GPU's name and count ("8xNVIDIA H100 80GB HBM3"), or
    "CPU" (with the processes of a distributed run)."""
    device, ranks = str(start.get("device", "?")), _whole(start, "world_size") or 1
    name = device.partition(" (")[2].removesuffix(")")
    if device.startswith(("cuda", "gpu")) and name:
        return f"{ranks}x{name}"
    if device == "cpu":
        return "CPU" if ranks == 1 else f"CPU ({ranks} processes)"
    return device


def val_curve(run_dir: str | Path) -> list[tuple[int, float]]:
    """A run's validations as (step, val_bpb), by step (a step validated twice, by a resumed run: its
    last figure): the curve `abort_behind` compares a run with."""
    path = Path(run_dir)
    if not (path / "metrics.jsonl").is_file():
        raise PgolfError(f"{path}: not a run directory (no metrics.jsonl) to compare with")
    by_step = {int(r["step"]): float(r["val_bpb"]) for r in read_metrics(path) if r["kind"] == "val"}
    curve = sorted((step, bpb) for step, bpb in by_step.items() if math.isfinite(bpb))
    if not curve:
        raise PgolfError(f"{path}: the run has logged no validation to compare with")
    return curve


def _score(final: dict[str, Any] | None, name: str) -> float:
    """A finished run's figure: the sliding-window one when it was scored so, else the round trip's."""
    sliding = _number(final, f"sliding_{name}")
    return _number(final, f"roundtrip_{name}") if math.isnan(sliding) else sliding


def run_groups(summaries: list[RunSummary]) -> dict[str, list[RunSummary]]:
    """The finished runs of each named group (train --seeds), by group name."""
    groups: dict[str, list[RunSummary]] = {}
    for s in summaries:
        if s.group and s.finished:
            groups.setdefault(s.group, []).append(s)
    return groups


def find_runs(root: str | Path) -> list[Path]:
    """Run directories under `root` (those holding a metrics log), oldest name first. A metrics log that is
    no regular file (a FIFO) counts: its reader refuses it by name rather than the run going unlisted."""
    root = Path(root)
    if not root.is_dir():
        raise PgolfError(f"{root}: no such directory of runs")
    return sorted(p for p in root.iterdir() if (p / "metrics.jsonl").exists())
