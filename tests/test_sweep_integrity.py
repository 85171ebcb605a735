"""Sweeps that cannot report what did not run (core/runs/sweep.py): the runs' environment, each finished
run matched to the spec by the config it trained with, grids counted before they are expanded, finals that
are not finite, files that are not files, spec errors that name the place."""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from core.common.errors import PgolfError
from core.runs import sweep as sw
from core.train.rundir import RunDir, config_digest
from tests.support.cli import assert_one_line_error, cli
from tests.support.runs import VARIANTS, fake_run, write_spec


def started_run(run: sw.PlannedRun, loss: float) -> None:
    """A finished run folder whose start logged the digest of its config, as training writes it."""
    folder = RunDir(run.path.parent, run.run_id)
    folder.metric(
        {"kind": "start", "step": 0, "backend": "cuda", "config_sha256": config_digest(run.cfg.to_dict())}
    )
    folder.close()
    fake_run(run.path, run.cfg, sweep=True, curve=3, roundtrip_val_loss=loss)


@pytest.mark.parametrize(
    ("environ", "refused"),
    [({"MATRIX_LR": "0.02"}, "sets matrix_lr itself: unset MATRIX_LR (it is '0.02' in the environment)"),
     ({"SEED": "7"}, "sets seed itself: unset SEED"),
     ({"ITERATIONS": "2"}, "sets iterations itself: unset ITERATIONS"),
     ({"RUN_ID": "x"}, "sets run_id itself: unset RUN_ID")],
)  # fmt: skip
def test_a_variable_the_spec_also_sets_is_refused(tmp_path, environ, refused):
    """MATRIX_LR=0.02 made every run train at 0.02 whatever its variant said; SEED=7 made every seed 7."""
    spec = write_spec(tmp_path, VARIANTS)
    with pytest.raises(PgolfError, match="^sweep spec .*s.toml sets ") as caught:
        sw.load_sweep(spec, environ=environ)
    assert refused in str(caught.value)
    assert_one_line_error(cli("sweep", str(spec), env=environ), refused)


def test_a_runs_environment_has_no_config_variable(tmp_path):
    """A run's whole config is its sweep_config.json: a variable the spec leaves alone reaches it there."""
    environ = {"PATH": "/bin", "TRAIN_MAX_SEQ_LEN": "64", "WARMDOWN_ITERS": "1"}
    assert sw.child_environ(environ) == {"PATH": "/bin"}
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ=environ)
    assert all(r.cfg.train_seq_len == 64 and r.cfg.warmdown_iters == 1 for r in plan.runs)
    assert sorted(r.cfg.seed for r in plan.runs) == [1, 1, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: (path / "config.json").unlink(),
        lambda path: (path / "config.json").write_text("{not json"),
        lambda path: (path / "config.json").write_text('"a string"'),
        # edited to the spec's new value after the run: not what its start logged
        lambda path: (path / "config.json").write_text(
            json.dumps(json.loads((path / "config.json").read_text()) | {"iterations": 5})
        ),
    ],
    ids=["deleted", "corrupted", "not-a-table", "edited"],
)
def test_a_run_whose_config_is_lost_is_unknown_not_relabelled(tmp_path, damage):
    """A spec edited after its runs finished, their config.json then damaged: the report counts them under
    no variant (it would have listed the old runs under the new value), and the sweep refuses them."""
    spec = write_spec(tmp_path, VARIANTS)
    plan = sw.load_sweep(spec, environ={})
    for run in plan.runs:
        started_run(run, 3.0 + run.seed / 100)
    edited = sw.load_sweep(
        write_spec(tmp_path, VARIANTS.replace("iterations = 3", "iterations = 5")), environ={}
    )
    damage(edited.runs[0].path)
    result = sw.report(edited)
    unknown = [m for m in result["not_finished"] if m["run"] == edited.runs[0].run_id]
    assert (
        unknown
        and unknown[0]["state"] == sw.UNKNOWN
        and "what it trained with is unknown" in unknown[0]["error"]
    )
    assert all(
        edited.runs[0].seed not in row["seeds"] for row in result["variants"] if row["variant"] == "base"
    )
    # the others are reported as what they are: trained with iterations=3, not the spec's 5
    assert result["finished"] == 0
    assert all("iterations=3, the spec now gives 5" in m["error"] for m in result["not_finished"][1:])
    with pytest.raises(PgolfError, match="what it trained with is unknown: remove the run"):
        sw.run_state(edited.runs[0])


def test_a_run_matching_the_spec_is_counted_and_its_unchanged_config_checked_by_digest(tmp_path):
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    for run in plan.runs:
        started_run(run, 3.0 + run.seed / 100)
    assert sw.report(plan)["finished"] == 9 and sw.run_state(plan.runs[0]) == sw.DONE


@pytest.mark.parametrize(("fields", "values", "seeds"), [(10, 10, 1), (6, 10, 1), (2, 80, 2)])
def test_a_grid_too_large_is_counted_before_it_is_expanded(tmp_path, fields, values, seeds):
    """10^10 and 10^6 grid points: one line at once (they were a MemoryError, and a quadratic hang)."""
    names = ["matrix_lr", "scalar_lr", "embed_lr", "tied_embed_lr", "head_lr", "muon_momentum",
             "beta1", "beta2", "adam_eps", "grad_clip_norm"][:fields]  # fmt: skip
    grid = "\n".join(f"{name} = [{', '.join(str(0.01 * (i + 1)) for i in range(values))}]" for name in names)
    spec = write_spec(tmp_path, f"seeds = {list(range(1, seeds + 1))}\n[grid]\n{grid}\n")
    t0 = time.monotonic()
    with pytest.raises(
        PgolfError,
        match=r"^sweep spec .*s.toml: \[grid\] makes .* runs, more than a sweep may plan \(10,000\)",
    ):
        sw.load_sweep(spec, environ={})
    assert time.monotonic() - t0 < 5
    assert_one_line_error(cli("sweep", str(spec), "--report"), "more than a sweep may plan")


def test_many_variants_are_checked_for_twins_in_linear_time(tmp_path):
    listed = "".join(f"[[variants]]\nname = 'v{i}'\nmatrix_lr = {0.001 * (i + 1)}\n" for i in range(3000))
    spec = write_spec(
        tmp_path, "preset = 'smoke'\n" + listed + "[[variants]]\nname = 'v7'\nmatrix_lr = 0.5\n"
    )
    with pytest.raises(PgolfError, match="two variants are named 'v7'"):
        sw.load_sweep(spec, environ={})


@pytest.mark.slow
@pytest.mark.parametrize("score", [math.nan, math.inf])
def test_a_final_score_that_is_not_finite_is_diverged(tmp_path, score):
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    for run in plan.runs:
        fake_run(run.path, run.cfg, sweep=True, curve=3, roundtrip_val_loss=3.0 + run.seed / 100)
    lines = (plan.runs[0].path / "metrics.jsonl").read_text().splitlines()
    final = json.loads(lines[-1]) | {"roundtrip_val_bpb": score}
    (plan.runs[0].path / "metrics.jsonl").write_text("\n".join([*lines[:-1], json.dumps(final)]) + "\n")
    result = sw.report(plan)
    assert [m["state"] for m in result["not_finished"]] == ["diverged"]
    assert result["finished"] == 8 and "): diverged" in sw.markdown(result)
    if math.isnan(score):  # (a TypeError traceback before)
        only = cli("sweep", str(plan.spec), "--report")
        assert only.returncode == 0 and "Traceback" not in only.stderr, only.stderr


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json", "checkpoints/step_000002.safetensors"])
def test_a_fifo_where_a_runs_file_should_be_is_an_error_never_a_resume(tmp_path, name):
    plan = sw.load_sweep(write_spec(tmp_path, VARIANTS), environ={})
    run = plan.runs[0]
    fake_run(run.path, run.cfg, sweep=True, curve=3, finished=False, checkpoint=True)
    (run.path / name).unlink()
    os.mkfifo(run.path / name)
    with pytest.raises(
        PgolfError, match=rf"{name} is not a regular file .*: the sweep neither reads nor resumes it"
    ):
        sw.run_state(run)
    assert_one_line_error(cli("sweep", str(plan.spec)), name, "is not a regular file")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "place"),
    [
        ("seeds = [-1]\n[grid]\nmatrix_lr = [0.1]", "seeds = [-1]: seed -1 is not in 0..4294967295"),
        ("seeds = [1, 4294967296]\n[grid]\nmatrix_lr = [0.1]", "seed 4294967296 is not in"),
        ("[base]\niterations = 'many'\n[grid]\nmatrix_lr = [0.1]", "the base config: iterations expects int"),
        ("[grid]\nmatrix_lr = [0.1]\nnum_heads = [3]", "variant 'matrix_lr=0.1,num_heads=3'"),
        ("backend = 'cudaa'\n[grid]\nmatrix_lr = [0.1]", "backend = 'cudaa' (did you mean 'cuda'?)"),
    ],
)
def test_every_spec_error_names_the_spec_and_the_place(tmp_path, text, place):
    spec = write_spec(tmp_path, text)
    with pytest.raises(PgolfError, match=r"^sweep spec .*s.toml: ") as caught:
        sw.load_sweep(spec, environ={})
    assert place in str(caught.value), str(caught.value)
    assert_one_line_error(cli("sweep", str(spec), "--report"), str(spec), place)


def test_a_fifo_metrics_log_blocks_neither_its_reader_nor_its_writer(tmp_path):
    """A run resumed by hand (`train --resume`) over such a folder: one line, not a process hung in open()."""
    from core.common.files import append_line
    from core.runs.summary import read_metrics

    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(PgolfError, match="metrics.jsonl is not a regular file"):
        read_metrics(tmp_path)
    with pytest.raises(PgolfError, match="cannot write .*metrics.jsonl: a FIFO, not a regular file"):
        append_line(fifo, "{}")
