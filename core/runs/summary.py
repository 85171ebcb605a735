"""A run directory read back: its checkpoints and artifact, its metrics, a summary per run.

core/train/rundir.py writes it (its files are listed there). Nothing here needs the framework
that trained the run."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.common.files import read_file

# The fields each kind of record must hold as numbers (other kinds are kept as they are).
NUMERIC_FIELDS = {
    "train": ("step", "train_time_ms", "train_loss"),
    "val": ("step", "train_time_ms", "val_bpb"),
    "final": ("steps", "train_time_ms", "roundtrip_val_bpb", "artifact_bytes", "code_bytes"),
}


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

    A run killed while writing can leave its last line cut short: that line is
    skipped. Damage anywhere else is an error naming the line.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    try:  # a regular file only: a FIFO there would block the reader
        lines = read_file(p, "metrics log").decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise PgolfError(f"{p}: cannot read the metrics log ({exc})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise PgolfError(f"{p}:{number}: not a JSON record") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise PgolfError(f"{p}:{number}: a record needs a 'kind'")
        for key in NUMERIC_FIELDS.get(record["kind"], ()):
            value = record.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise PgolfError(
                    f"{p}:{number}: a {record['kind']} record needs a number '{key}', got {value!r}"
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


def summarize(run_dir: str | Path) -> RunSummary:
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    try:
        cfg = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        model = f"{cfg['num_layers']}x{cfg['model_dim']}, vocab {cfg['vocab_size']}"
    except (OSError, ValueError, KeyError, TypeError):
        cfg, model = {}, "?"
    cfg = cfg if isinstance(cfg, dict) else {}
    start = next((r for r in reversed(records) if r["kind"] == "start"), {})
    seed = cfg.get("seed")
    final = next((r for r in reversed(records) if r["kind"] == "final"), None)
    vals = [r for r in records if r["kind"] == "val"]
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
    )


def _score(final: dict[str, Any] | None, name: str) -> float:
    """A finished run's figure: the sliding-window one when it was scored so, else the round trip's."""
    if final is None:
        return math.nan
    value = final.get(f"sliding_{name}")
    value = final.get(f"roundtrip_{name}") if value is None else value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def run_groups(summaries: list[RunSummary]) -> dict[str, list[RunSummary]]:
    """The finished runs of each named group (train --seeds), by group name."""
    groups: dict[str, list[RunSummary]] = {}
    for s in summaries:
        if s.group and s.finished:
            groups.setdefault(s.group, []).append(s)
    return groups


def find_runs(root: str | Path) -> list[Path]:
    """Run directories under `root` (those holding a metrics log), oldest name first."""
    root = Path(root)
    if not root.is_dir():
        raise PgolfError(f"{root}: no such directory of runs")
    return sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file())
