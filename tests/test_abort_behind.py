"""train --abort-behind RUN --abort-margin X: a run that falls behind a reference run stops at a
validation, with a checkpoint, exit status 4 and a line naming both figures; smoke-sized runs."""

from __future__ import annotations

import json
import math

import pytest

from core.common.errors import PgolfError
from core.model import backend as backends
from core.runs.summary import read_metrics, summarize, val_curve
from core.train.managed import BehindReference, reference_bpb, train_managed
from tests.support.backends import make_backend, needs
from tests.support.cli import cli, data_flags
from tests.support.runs import VARIANTS, fake_run, write_spec

STEPS = 2
TOO_HOT = {"tied_embed_lr": 1.0, "matrix_lr": 0.2}  # learning rates far too high: a run deliberately worse


def run(dataset, backend_name, out, run_id, **changes):
    cfg = dataset.config(
        "smoke", out_dir=str(out), run_id=run_id, iterations=STEPS, val_loss_every=1, **changes
    )
    reference = val_curve(cfg.abort_behind) if cfg.abort_behind else ()
    backend = make_backend(backend_name, cfg)
    try:
        return train_managed(backend, log=lambda line: None, reference=reference)
    finally:
        backend.close()


@pytest.fixture(scope="module")
def reference_run(sotu_dataset, tmp_path_factory):
    """A smoke run validated at every step, with the first installed backend."""
    name = next((n for n, info in backends.BACKENDS.items() if info.installed), None)
    if name is None:
        pytest.skip("no backend installed")
    return run(sotu_dataset, name, tmp_path_factory.mktemp("runs"), "reference").run_dir


def test_the_reference_is_read_between_its_validations(tmp_path):
    curve = [(0, 4.0), (10, 3.0), (20, 2.5)]
    assert reference_bpb(curve, 0) == 4.0 and reference_bpb(curve, 20) == 2.5
    assert reference_bpb(curve, 5) == pytest.approx(3.5) and reference_bpb(curve, 15) == pytest.approx(2.75)
    assert reference_bpb(curve, 21) is None and reference_bpb([], 3) is None
    with pytest.raises(PgolfError, match="not a run directory \\(no metrics.jsonl\\) to compare with"):
        val_curve(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1, "train_time_ms": 1, "train_loss": 7}\n'
    )
    with pytest.raises(PgolfError, match="has logged no validation"):
        val_curve(tmp_path)


def stopped_record(run_dir, reference_run) -> dict:
    """The run's stop, checked against the reference's figure at that step and what the run left."""
    records = read_metrics(run_dir)
    (stop,) = [r for r in records if r["kind"] == "stopped"]
    theirs = dict(val_curve(reference_run))[stop["step"]]
    assert (
        1 <= stop["step"] <= STEPS and stop["val_bpb"] > theirs + 0.01 and stop["reference_val_bpb"] == theirs
    )
    assert not any(r["kind"] == "final" for r in records) and not list(run_dir.glob("final_model.*"))
    assert (run_dir / "checkpoints" / f"step_{stop['step']:06d}.safetensors").is_file()
    line = (run_dir / "train.log").read_text().splitlines()[-1]
    assert f"val_bpb {stop['val_bpb']:.4f}, {reference_run}'s {theirs:.4f} at that step" in line
    summary = summarize(run_dir)
    assert summary.stopped == f"behind {reference_run}" and not summary.finished
    return stop


@pytest.mark.slow
@needs("mlx")
def test_a_run_far_behind_its_reference_is_stopped(sotu_dataset, reference_run, tmp_path):
    with pytest.raises(BehindReference) as stopped:
        run(
            sotu_dataset,
            "mlx",
            tmp_path,
            "worse",
            abort_behind=str(reference_run),
            abort_margin=0.01,
            **TOO_HOT,
        )
    assert stopped.value.status == 4
    stopped_record(tmp_path / "worse", reference_run)
    assert (tmp_path / "worse" / "train.log").read_text().splitlines()[-1] == str(stopped.value)


def test_a_run_level_with_its_reference_goes_on_to_its_score(sotu_dataset, reference_run, tmp_path):
    """The reference's own settings and seed: the same curve, never behind by the margin."""
    name = read_metrics(reference_run)[0]["backend"]
    result = run(sotu_dataset, name, tmp_path, "level", abort_behind=str(reference_run), abort_margin=0.01)
    assert result.steps == STEPS and math.isfinite(result.roundtrip_val_bpb)
    assert summarize(result.run_dir).stopped == ""


@pytest.mark.slow
@needs("cuda")
def test_the_cli_stops_with_status_4_one_line_and_runs_says_why(sotu_dataset, reference_run, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", str(STEPS), "--val-loss-every",
                 "1", "--out-dir", str(tmp_path), "--run-id", "worse", "--abort-behind", str(reference_run),
                 "--tied-embed-lr", "1.0", "--matrix-lr", "0.2", *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 4, result.stderr
    (line,) = result.stderr.strip().splitlines()
    stop = stopped_record(tmp_path / "worse", reference_run)
    assert line == f"error: {(tmp_path / 'worse' / 'train.log').read_text().splitlines()[-1]}"
    assert line.startswith(f"error: stopped at step {stop['step']}, behind the reference: val_bpb ")
    listed = json.loads(CliRunner().invoke(app, ["runs", "--out-dir", str(tmp_path), "--json"]).output)
    assert listed["stopped"] == f"behind {reference_run}" and not listed["finished"]
    assert "stopped: behind" in CliRunner().invoke(app, ["runs", "--out-dir", str(tmp_path)]).output


def test_a_sweep_counts_a_run_stopped_behind_apart_from_failures(tmp_path):
    from core.runs import sweep as sw
    from core.train.rundir import RunDir

    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    behind, failed = plan.runs[0], plan.runs[1]
    fake_run(
        behind.path, behind.cfg, sweep=True, curve=3, finished=False, checkpoint=True
    )  # a checkpoint, as a stopped run has: it would be resumed
    folder = RunDir(behind.path.parent, behind.run_id, reuse=True)
    folder.metric(
        {"kind": "stopped", "why": "behind runs/ref", "step": 2, "val_bpb": 5.0, "reference_val_bpb": 3.0}
    )
    folder.close()
    fake_run(failed.path, failed.cfg, sweep=True, curve=3, finished=False, failed="error: no such shard")
    assert (sw.run_state(behind), sw.run_state(failed)) == (sw.BEHIND, sw.FAILED)
    states = {m["run"]: (m["state"], m["error"]) for m in sw.report(plan)["not_finished"]}
    assert states[behind.run_id] == ("behind", "stopped behind runs/ref")
    assert states[failed.run_id] == ("failed", "error: no such shard")
