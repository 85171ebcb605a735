"""Sweeps (core/runs/sweep.py, cli.py sweep): the spec and its one-line errors, the plan of runs, where
each run stands, the report against scipy, and a real sweep stopped and started again."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.runs import sweep as sw
from core.train.rundir import RunDir
from tests.support.backends import needs
from tests.support.cli import assert_one_line_error, cli, start_cli
from tests.support.runs import VARIANTS, fake_run, write_spec

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("presett = 'smoke'\n[grid]\nmatrix_lr = [0.1]", "unknown key 'presett' (did you mean 'preset'?)"),
        ("[grid]\nmatrix_lrr = [0.1]", "unknown config field 'matrix_lrr' (did you mean 'matrix_lr'?)"),
        ("[grid]\nmatrix_lr = 0.1", "[grid] matrix_lr must be a non-empty list of values"),
        ("[grid]\nmatrix_lr = [0.1, 0.1]", "lists a value twice"),
        ("[grid]\nmatrix_lr = [0.1]\n[[variants]]\nname = 'a'", "not both"),
        ("seeds = [1]", "not neither"),
        ("seeds = [1, 1]\n[grid]\nmatrix_lr = [0.1]", "seeds must be a list of distinct whole numbers"),
        ("parallel = 0\n[grid]\nmatrix_lr = [0.1]", "parallel must be a whole number >= 1"),
        ("[base]\nseed = 3\n[grid]\nmatrix_lr = [0.1]", "[base]: seed is set by the sweep"),
        ("[[variants]]\nname = 'a/b'", "variant 1 needs a name"),
        ("[[variants]]\nname = 'a'\n[[variants]]\nname = 'a'", "two variants are named 'a'"),
        ("[[variants]]\nname = 'a'\nmatrix_lr = -1.0", "variant 'a': matrix_lr must be"),
        ("[[variants]]\nname = 'base'\nmatrix_lr = 0.5", "the variant named 'base' changes the base config"),
        ("preset = 'tinyy'\n[grid]\nmatrix_lr = [0.1]", "unknown preset 'tinyy' (did you mean 'tiny'?)"),
        ("[grid\n", "not valid TOML"),
    ],
)
def test_spec_errors_name_the_problem(tmp_path, text, fragment):
    with pytest.raises(PgolfError, match="^sweep spec .*s.toml") as caught:
        sw.load_sweep(write_spec(tmp_path, text))
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
def test_a_bad_spec_is_one_line_from_the_cli(tmp_path):
    spec = write_spec(tmp_path, "[[variants]]\nname = 'a'\nmlp_mul = 3.0\n")
    assert_one_line_error(
        cli("sweep", str(spec)), "unknown config field 'mlp_mul'", "did you mean 'mlp_mult'"
    )
    assert_one_line_error(cli("sweep", str(tmp_path / "none.toml")), "none.toml")


@pytest.mark.slow
def test_one_sweep_of_a_spec_at_a_time(tmp_path):
    from core.common.files import WriterLock

    spec = write_spec(tmp_path, VARIANTS)
    with WriterLock(spec, "sweep spec"):
        assert_one_line_error(
            cli("sweep", str(spec)), f"sweep spec {spec} is in use by", "one writer at a time"
        )
    assert not (tmp_path / "runs").exists()


def test_the_plan_of_a_grid_finds_the_base_among_its_points(tmp_path):
    spec = write_spec(
        tmp_path,
        'preset = "smoke"\nseeds = [4, 5]\n[grid]\nmatrix_lr = [0.02, 0.04]\nmlp_mult = [2.0, 3.0]\n',
    )
    plan = sw.load_sweep(spec, environ={})
    names = [v.name for v in plan.variants]
    # smoke's own matrix_lr (0.04) and mlp_mult (2.0) make the grid point that is the base: it comes first
    assert names == ["matrix_lr=0.04,mlp_mult=2.0", "matrix_lr=0.02,mlp_mult=2.0", "matrix_lr=0.02,mlp_mult=3.0",
                     "matrix_lr=0.04,mlp_mult=3.0"]  # fmt: skip
    assert plan.base is plan.variants[0] and plan.name == "s"
    assert [(r.variant, r.seed) for r in plan.runs] == [(n, s) for n in names for s in (4, 5)]
    run = plan.runs[5]  # matrix_lr=0.02,mlp_mult=3.0 seed 5
    assert (run.cfg.matrix_lr, run.cfg.mlp_mult, run.cfg.seed) == (0.02, 3.0, 5)
    assert (
        run.run_id == "s-matrix_lr=0.02,mlp_mult=3.0-seed5"
        and run.cfg.run_group == "s-matrix_lr=0.02,mlp_mult=3.0"
    )
    assert run.path == tmp_path / "runs" / run.run_id
    assert plan.report_path(".md") == tmp_path / "s.report.md"


def test_the_plan_of_variants_adds_the_base(tmp_path):
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    assert [v.name for v in plan.variants] == ["base", "lr_low", "wide"]
    assert [r.run_id for r in plan.runs[:4]] == [
        "abl-base-seed1",
        "abl-base-seed2",
        "abl-base-seed3",
        "abl-lr_low-seed1",
    ]
    assert all(r.cfg.iterations == 3 for r in plan.runs)  # [base] reaches every variant
    assert plan.variants[2].settings == {"mlp_mult": 3.0} and plan.variants[2].cfg.mlp_mult == 3.0
    assert plan.variants[0].cfg.mlp_mult == 2.0 and plan.parallel == 1 and plan.backend == "auto"


LOSSES = {"base": [3.10, 3.12, 3.11], "lr_low": [3.00, 3.05, 3.02], "wide": [3.11, 3.09]}


@pytest.mark.slow
def test_the_report_ranks_the_variants_with_scipys_p_values(tmp_path):
    spec = write_spec(tmp_path, "margin_nats = 0.005\n" + VARIANTS)
    plan = sw.load_sweep(spec, environ={})
    for run in plan.runs:
        losses = LOSSES[run.variant]
        if run.seed <= len(losses):
            fake_run(run.path, run.cfg, sweep=True, curve=3, roundtrip_val_loss=losses[run.seed - 1])
        else:
            fake_run(
                run.path,
                run.cfg,
                sweep=True,
                curve=3,
                finished=False,
                failed="error: training diverged: val_loss nan at step 2",
            )
    result, paths, no_plot = sw.write_report(plan, "python cli.py sweep s.toml")
    plots = importlib.util.find_spec("matplotlib") is not None  # the `plot` extra, or where it is missing
    assert no_plot == ("" if plots else "no plot: plotting needs matplotlib: pip install 'pgolf[plot]'")
    assert [r["variant"] for r in result["variants"]] == ["lr_low", "wide", "base"]
    for row in result["variants"]:
        losses = LOSSES[row["variant"]]
        assert row["mean_bpb"] == pytest.approx(np.mean(losses) / 2, abs=1e-12)
        assert row["std_loss"] == pytest.approx(np.std(losses, ddof=1), abs=1e-12)
        assert row["diff_nats"] == pytest.approx(np.mean(losses) - np.mean(LOSSES["base"]), abs=1e-12)
        if row["variant"] == "base":
            assert row["p"] is None
            continue
        ref = scipy_stats.ttest_ind(LOSSES["base"], losses, equal_var=False, alternative="greater")
        assert row["p"] == pytest.approx(ref.pvalue, rel=1e-12)
        shifted = scipy_stats.ttest_ind(
            np.array(LOSSES["base"]) - 0.005, losses, equal_var=False, alternative="greater"
        )
        assert row["p_margin"] == pytest.approx(shifted.pvalue, rel=1e-12)
    assert result["finished"] == 8
    assert result["not_finished"] == [
        {"run": "abl-wide-seed3", "variant": "wide", "seed": 3, "state": "diverged", "step": 3,
         "error": "error: training diverged: val_loss nan at step 2"}
    ]  # fmt: skip
    assert [p.name for p in paths] == ["s.report.json", "s.report.md", *(["s.report.png"] if plots else [])]
    assert json.loads(paths[0].read_text()) == result
    text = paths[1].read_text()
    assert "| 1 | lr_low | matrix_lr=0.02 | 3 |" in text and "abl-wide-seed3 (wide, seed 3): diverged" in text
    assert "`python cli.py sweep s.toml`" in text
    assert not plots or paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_where_each_run_stands(tmp_path):
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    done, failed, resumable, fresh, empty = plan.runs[:5]
    fake_run(done.path, done.cfg, sweep=True, curve=3, roundtrip_val_loss=3.0)
    fake_run(failed.path, failed.cfg, sweep=True, curve=3, finished=False, failed="error: boom")
    fake_run(resumable.path, resumable.cfg, sweep=True, curve=3, finished=False, checkpoint=True)
    fake_run(
        fresh.path, fresh.cfg, sweep=True, curve=3, finished=False
    )  # stopped before its first checkpoint: started again
    assert [sw.run_state(r) for r in plan.runs[:5]] == [sw.DONE, sw.FAILED, sw.RESUME, sw.NEW, sw.NEW]
    assert sw.failure(failed.path) == "error: boom"
    # a spec edited after a run finished: refused rather than mixed into one table
    edited = sw.load_sweep(
        write_spec(tmp_path, VARIANTS.replace("iterations = 3", "iterations = 5")), environ={}
    )
    with pytest.raises(PgolfError, match="was trained with iterations=3, the spec now gives 5"):
        sw.run_state(edited.runs[0])
    # a folder the sweep did not write, and one that a process is writing, are left alone
    (empty.path).mkdir(parents=True)
    (empty.path / "notes.txt").write_text("mine")
    with pytest.raises(PgolfError, match="holds what this sweep did not write"):
        sw.run_state(empty)
    held = RunDir(resumable.path.parent, resumable.run_id, reuse=True)
    with pytest.raises(PgolfError, match="in use by process"):
        sw.run_state(resumable)
    held.close()


def _sweep_files(tmp_path, dataset, iterations: int = 4):
    """A sweep spec of the smoke preset on MLX: each run is a `cli.py train` process of its own, which
    starts in a third of the time a PyTorch one takes (no PyTorch to import); the sweep is the same."""
    spec = write_spec(tmp_path, f"""
name = "e2e"
preset = "smoke"
backend = "mlx"
seeds = [1, 2]
parallel = 2
[base]
data_path = "{dataset.data_path}"
tokenizer_path = "{dataset.tokenizer_path}"
iterations = {iterations}
[[variants]]
name = "lr_high"
matrix_lr = 0.08
""")  # fmt: skip
    return spec, sw.load_sweep(spec)


@pytest.mark.slow
@needs("mlx")
def test_a_sweep_runs_skips_what_is_done_and_resumes_what_is_not(sotu_dataset, tmp_path):
    """2 variants x 2 seeds of the smoke preset: run, run again (nothing redone), then with one run
    made unfinished (its final record and artifact gone: it resumes from its last checkpoint) and one
    started over (no checkpoint)."""
    spec, plan = _sweep_files(tmp_path, sotu_dataset)
    first = cli("sweep", str(spec))
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("done e2e-") == 4 and (tmp_path / "s.report.png").is_file()
    logs = {r.run_id: (r.path / "metrics.jsonl").read_bytes() for r in plan.runs}
    again = cli("sweep", str(spec))
    assert again.returncode == 0, again.stderr
    assert "4 done, 0 failed before, 0 to resume; 0 to run" in again.stdout and "started" not in again.stdout
    assert {r.run_id: (r.path / "metrics.jsonl").read_bytes() for r in plan.runs} == logs

    cut, restart = plan.runs[1], plan.runs[2]
    lines = logs[cut.run_id].decode().splitlines(keepends=True)
    (cut.path / "metrics.jsonl").write_text("".join(line for line in lines if '"kind": "final"' not in line))
    for artifact in cut.path.glob("final_model.*"):
        artifact.unlink()
    for checkpoint in (restart.path / "checkpoints").glob("*"):
        checkpoint.unlink()
    (restart.path / "metrics.jsonl").write_text(logs[restart.run_id].decode().splitlines(keepends=True)[0])
    third = cli("sweep", str(spec))
    assert third.returncode == 0, third.stderr
    assert "2 done, 0 failed before, 1 to resume; 2 to run" in third.stdout
    assert f"resumed {cut.run_id}" in third.stdout and f"started {restart.run_id}" in third.stdout
    for run in plan.runs:
        if run not in (cut, restart):
            assert (run.path / "metrics.jsonl").read_bytes() == logs[run.run_id]
    report = json.loads((tmp_path / "s.report.json").read_text())
    assert report["finished"] == 4 and report["not_finished"] == []
    from core.runs.summary import summarize

    loss = {
        v: [summarize(r.path).score_val_loss for r in plan.runs if r.variant == v]
        for v in ("base", "lr_high")
    }
    ref = scipy_stats.ttest_ind(loss["base"], loss["lr_high"], equal_var=False, alternative="greater")
    row = next(r for r in report["variants"] if r["variant"] == "lr_high")
    assert row["p"] == pytest.approx(ref.pvalue, rel=1e-9) and row["val_loss"] == loss["lr_high"]
    only = cli("sweep", str(spec), "--report")
    assert only.returncode == 0 and "started" not in only.stdout and "| lr_high |" in only.stdout


@pytest.mark.slow
@needs("mlx")
def test_ctrl_c_stops_the_runs_with_a_checkpoint_and_a_restart_resumes_them(sotu_dataset, tmp_path):
    spec, plan = _sweep_files(tmp_path, sotu_dataset, iterations=400)
    proc = start_cli("sweep", str(spec), "--parallel", "1")  # SIGINT not ignored, wherever the suite runs
    first = plan.runs[0]
    deadline = time.monotonic() + 300  # a loaded machine: the state is waited for, never guessed
    while sw.run_step(first.path) < 3 and proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the first run logged no step 3 in 300 s: {proc.communicate(timeout=60)[1][-2000:]}")
        time.sleep(0.2)
    # still running, the first run at step 3 of 400
    assert proc.poll() is None, proc.communicate(timeout=60)[1][-2000:]
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopping 1 runs, each with a checkpoint" in err and err.strip().endswith("interrupted")
    assert sw.run_state(first) == sw.RESUME and all(not r.path.exists() for r in plan.runs[1:])
    stopped = (first.path / "train.log").read_text()
    assert f"stopped at step {sw.run_step(first.path)}: checkpoint" in stopped
    assert not (first.path / sw.FAILED_FILE).exists()  # stopped is not failed: the next start resumes it


def test_without_matplotlib_the_table_is_written_and_the_plot_named_missing(tmp_path, monkeypatch):
    from core.runs import plots

    def no_matplotlib():
        raise PgolfError("plotting needs matplotlib: pip install 'pgolf[plot]'")

    monkeypatch.setattr(plots, "_pyplot", no_matplotlib)
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    fake_run(plan.runs[0].path, plan.runs[0].cfg, sweep=True, curve=3, roundtrip_val_loss=3.0)
    result, paths, no_plot = sw.write_report(plan)
    assert [p.name for p in paths] == ["s.report.json", "s.report.md"] and result["finished"] == 1
    assert no_plot == "no plot: plotting needs matplotlib: pip install 'pgolf[plot]'"
    assert not (tmp_path / "s.report.png").exists()
