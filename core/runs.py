"""The run directory: written by a training run, read back as a summary per run and a plot.

A run directory holds:
    config.json          the resolved config
    metrics.jsonl        one JSON record per line: kind = start (backend, device; once per start or
                         resume) | train | val | final
    train.log            the console lines
    checkpoints/step_NNNNNN.safetensors
    final_model.<label>.pgolf   the artifact: int8, int6, ... (core.artifact.quant_label)

Nothing here needs the framework that trained the run.
"""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.atomic import append_line, make_dir, remove_stale_temps, write_atomic
from core.errors import PgolfError
from core.report import open_reporters, scalars

# The fields each kind of record must hold as numbers (other kinds are kept as they are).
NUMERIC_FIELDS = {
    "train": ("step", "train_time_ms", "train_loss"),
    "val": ("step", "train_time_ms", "val_bpb"),
    "final": ("steps", "train_time_ms", "roundtrip_val_bpb", "artifact_bytes", "code_bytes"),
}


class RunDir:
    """The files of one training run; only rank 0 writes."""

    def __init__(self, root: str | Path, run_id: str = "", enabled: bool = True, reuse: bool = False):
        """`reuse` lets a resumed run write into a directory that already holds a run."""
        self.run_id = run_id or time.strftime("%Y%m%d-%H%M%S")
        self.path = Path(root) / self.run_id
        self.enabled = enabled
        self.reporters: list[Any] = []  # live trackers the metrics go to as well (core.report)
        if not enabled:
            return
        if not reuse and (self.path / "config.json").exists():
            raise PgolfError(f"run directory {self.path} already holds a run: choose another --run-id")
        make_dir(self.path / "checkpoints", "run directory")
        for folder in (self.path, self.path / "checkpoints"):  # a killed run's temp files, when resuming it
            remove_stale_temps(folder)

    def artifact(self, label: str = "int8") -> Path:
        return self.path / f"final_model.{label}.pgolf"

    def checkpoint_path(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step_{step:06d}.safetensors"

    def write_config(self, config: dict[str, Any]) -> None:
        if self.enabled:
            write_atomic(self.path / "config.json", (json.dumps(config, indent=2) + "\n").encode())

    def metric(self, record: dict[str, Any]) -> None:
        if self.enabled:
            append_line(self.path / "metrics.jsonl", json.dumps(record))
            found = scalars(record) if self.reporters else None
            for reporter in self.reporters if found else ():
                reporter.log(*found)

    def report_to(self, targets: list[str], config: dict[str, Any]) -> None:
        """Mirror the metrics to these trackers from now on (rank 0 only)."""
        if self.enabled:
            self.reporters = open_reporters(targets, self.path, self.run_id, config)

    def close(self) -> None:
        """Close the trackers (the files need no closing)."""
        for reporter in self.reporters:
            reporter.close()
        self.reporters = []

    def log_line(self, line: str) -> None:
        if self.enabled:
            append_line(self.path / "train.log", line)


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
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
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


PLOT_FORMATS = ("png", "svg", "pdf")
SMOOTHING = 0.9  # the weight of the past in the smoothed training loss (about the last 10 records)


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """An exponential moving average, debiased so that it starts at the first value."""
    out, average = [], 0.0
    for i, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def focus(values: list[float]) -> tuple[float, float] | None:
    """A y-range that holds `values` with a margin (None for no values)."""
    if not values:
        return None
    low, high = min(values), max(values)
    margin = 0.05 * (high - low) or 0.05 * abs(high) or 0.05
    return low - margin, high + margin


def draw_runs(run_dirs: list[Path], x: str = "step"):
    """The figure of `plot_runs`: validation BPB (its y-range leaves out the step-0 value of the
    untrained model) and training loss, raw and smoothed (its y-range follows the smoothed curve
    past the first tenth of each run)."""
    if x not in ("step", "time"):
        raise PgolfError(f"unknown x axis {x!r} (choose step or time)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PgolfError("plotting needs matplotlib: pip install 'pgolf[plot]'") from None

    def xs(records: list[dict[str, Any]]) -> list[float]:
        return [r["step"] if x == "step" else r["train_time_ms"] / 60_000 for r in records]

    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    shown_val: list[float] = []
    shown_train: list[float] = []
    for run_dir in run_dirs:
        records = read_metrics(run_dir)
        vals = [r for r in records if r["kind"] == "val"]
        trains = [r for r in records if r["kind"] == "train"]
        (line,) = ax_val.plot(xs(vals), [r["val_bpb"] for r in vals], marker=".", label=run_dir.name)
        color = line.get_color()
        shown_val += [r["val_bpb"] for r in vals if r["step"] > 0]
        losses = [r["train_loss"] for r in trains]
        ax_train.plot(xs(trains), losses, color=color, lw=0.7, alpha=0.3)
        smoothed = smooth(losses)
        ax_train.plot(xs(trains), smoothed, color=color, lw=1.5, label=run_dir.name)
        shown_train += smoothed[len(smoothed) // 10 :]
        final = next((r for r in records if r["kind"] == "final"), None)
        if final is not None and vals:
            ax_val.plot(xs(vals)[-1:], [final["roundtrip_val_bpb"]], marker="x", color=color)
            shown_val.append(final["roundtrip_val_bpb"])
    for ax, shown in ((ax_val, shown_val), (ax_train, shown_train)):
        limits = focus(shown)
        if limits is not None:
            ax.set_ylim(*limits)
    label = "step" if x == "step" else "training time (min)"
    ax_val.set(xlabel=label, ylabel="val_bpb", title="validation bits per byte (x: after int8 round trip)")
    ax_train.set(xlabel=label, ylabel="train loss (nats)", title=f"training loss (smoothed: EMA {SMOOTHING})")
    for ax in (ax_val, ax_train):
        ax.grid(alpha=0.3)
    ax_val.legend(fontsize="small")
    return fig


def plot_runs(run_dirs: list[Path], out: Path, x: str = "step") -> Path:
    """Validation BPB and training loss of each run, against steps or training minutes, in the format
    that `out`'s extension names (png, svg or pdf)."""
    kind = Path(out).suffix.lower().removeprefix(".")
    if kind not in PLOT_FORMATS:
        raise PgolfError(
            f"{out}: the plot's file name must end in {', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    fig = draw_runs(run_dirs, x)
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format=kind, dpi=120)
    plt.close(fig)
    return write_atomic(out, buffer.getvalue())
