"""Runs side by side: validation BPB and the smoothed training loss, as png, svg or pdf."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.common.files import write_atomic
from core.runs.summary import read_metrics

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


def _pyplot():
    """matplotlib's pyplot, drawing to files only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PgolfError("plotting needs matplotlib: pip install 'pgolf[plot]'") from None
    return plt


def draw_runs(run_dirs: list[Path], x: str = "step"):
    """The figure of `plot_runs`: validation BPB (its y-range leaves out the step-0 value of the
    untrained model) and training loss, raw and smoothed (its y-range follows the smoothed curve
    past the first tenth of each run)."""
    if x not in ("step", "time"):
        raise PgolfError(f"unknown x axis {x!r} (choose step or time)")
    plt = _pyplot()

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
    return _save(lambda: draw_runs(run_dirs, x), out)


def _save(draw, out: Path) -> Path:
    """Write the figure `draw()` makes to `out`, in the format its extension names."""
    kind = Path(out).suffix.lower().removeprefix(".")
    if kind not in PLOT_FORMATS:
        raise PgolfError(
            f"{out}: the plot's file name must end in {', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    fig = draw()
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=kind, dpi=120)
    plt.close(fig)
    return write_atomic(out, buffer.getvalue())


def draw_sweep(report: dict[str, Any], curves: dict[str, list[Path]]):
    """The figure of `plot_sweep`: each variant's final val_bpb (a point per seed, its mean and
    standard deviation), best first; and the validation curves of its runs, a colour per variant."""
    plt = _pyplot()
    rows = [r for r in report["variants"] if r["val_bpb"]]
    fig, (ax_rank, ax_val) = plt.subplots(
        1, 2, figsize=(12, max(4.5, 0.45 * len(rows) + 1.5)), constrained_layout=True
    )
    colors = {}
    for y, row in enumerate(rows):
        xs = row["val_bpb"]
        (points,) = ax_rank.plot(xs, [y] * len(xs), "o", alpha=0.6, label=None)
        colors[row["variant"]] = points.get_color()
        spread = row["std_bpb"] or 0.0
        ax_rank.errorbar([row["mean_bpb"]], [y], xerr=[spread], fmt="|", color="black", ms=14, capsize=4)
    ax_rank.set_yticks(range(len(rows)), [r["variant"] for r in rows], fontsize="small")
    ax_rank.set_ylim(len(rows) - 0.5, -0.5)  # the best at the top
    ax_rank.set(xlabel="final val_bpb (dots: seeds; bar: mean ± std)",
                title=f"sweep {report['sweep']}: {report['finished']} of {report['runs']} runs")  # fmt: skip
    shown: list[float] = []
    for variant, run_dirs in curves.items():
        color = colors.get(variant)
        for number, run_dir in enumerate(run_dirs):
            vals = [r for r in read_metrics(run_dir) if r["kind"] == "val"]
            ax_val.plot([r["step"] for r in vals], [r["val_bpb"] for r in vals], marker=".", lw=1,
                        color=color, alpha=0.8, label=variant if number == 0 else None)  # fmt: skip
            shown += [r["val_bpb"] for r in vals if r["step"] > 0]
    limits = focus(shown)
    if limits is not None:
        ax_val.set_ylim(*limits)
    ax_val.set(xlabel="step", ylabel="val_bpb", title="validation bits per byte (before the int8 round trip)")
    for ax in (ax_rank, ax_val):
        ax.grid(alpha=0.3)
    ax_val.legend(fontsize="small")
    return fig


def plot_sweep(report: dict[str, Any], curves: dict[str, list[Path]], out: Path) -> Path:
    """The sweep report's plot (core/runs/sweep.py): final val_bpb by variant, and the curves."""
    return _save(lambda: draw_sweep(report, curves), out)
