"""Reading runs back: the metrics log, per-run summaries, and the curves plot."""

from __future__ import annotations

import math

import pytest

from core.common.errors import PgolfError
from core.runs.plots import draw_runs, plot_runs, smooth
from core.runs.summary import find_runs, read_metrics, summarize
from core.train.rundir import RunDir
from tests.support.runs import fake_run


def test_a_finished_and_an_unfinished_run_are_summarized(tmp_path):
    done = summarize(
        fake_run(tmp_path / "done", curve=4, roundtrip_val_bpb=2.5, artifact_bytes=1000, code_bytes=234)
    )
    assert (done.steps, done.train_time_ms, done.finished) == (4, 400.0, True)
    assert done.val_bpb == pytest.approx(2.6) and done.roundtrip_val_bpb == 2.5
    assert done.total_bytes == 1234 and done.model == "2x64, vocab 1024"
    partial = summarize(fake_run(tmp_path / "partial", curve=3, finished=False))
    assert (partial.steps, partial.train_time_ms, partial.finished) == (3, 300.0, False)
    assert partial.val_bpb == pytest.approx(2.8)
    assert math.isnan(partial.roundtrip_val_bpb) and partial.total_bytes is None
    (tmp_path / "not-a-run").mkdir()
    assert [p.name for p in find_runs(tmp_path)] == ["done", "partial"]


def test_a_cut_off_last_line_is_skipped_but_damage_elsewhere_is_named(tmp_path):
    path = fake_run(tmp_path / "r", curve=2, finished=False)
    log = path / "metrics.jsonl"
    good = log.read_text()
    log.write_text(good + '{"kind": "train", "st')
    assert [r["kind"] for r in read_metrics(path)] == ["train", "train", "val"]
    log.write_text('{"kind": "tr\n' + good)
    with pytest.raises(PgolfError, match=r"metrics.jsonl:1: not valid JSON"):
        read_metrics(path)
    log.write_text("[1, 2]\n" + good)
    with pytest.raises(PgolfError, match=r"metrics.jsonl:1: a record needs a 'kind'"):
        read_metrics(path)
    log.write_text('{"kind": "val", "step": "3", "train_time_ms": 1, "val_bpb": 2}\n' + good)
    with pytest.raises(
        PgolfError, match=r"metrics.jsonl:1: a val record needs a finite number 'step', got '3'"
    ):
        read_metrics(path)


@pytest.mark.slow
def test_the_plot_is_a_png_of_the_expected_size(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    runs = [fake_run(tmp_path / "a", curve=4), fake_run(tmp_path / "b", curve=6, finished=False)]
    out = plot_runs(runs, tmp_path / "curves.png", x="time")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1440, 540)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16)) > 50  # lines and text, not blank
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["curves.png"]
    with pytest.raises(PgolfError, match="unknown x axis 'steps'"):
        plot_runs(runs, tmp_path / "other.png", x="steps")


def test_the_summary_names_backend_seed_and_dataset(tmp_path):
    start = {"kind": "start", "step": 0, "backend": "mlx", "device": "cpu", "world_size": 1}
    run = fake_run(tmp_path / "r", {"seed": 7, "dataset": "sotu_sp1024"}, records=[start], finished=False)
    s = summarize(run)
    assert (s.backend, s.seed, s.dataset) == ("mlx", 7, "sotu_sp1024")
    old = summarize(fake_run(tmp_path / "old", curve=4))  # written before these were recorded
    assert (old.backend, old.seed, old.dataset) == ("?", None, "?")


def test_the_plot_leaves_out_step_0_and_smooths_the_training_loss(tmp_path):
    pytest.importorskip("matplotlib")
    run = fake_run(tmp_path / "a", curve=40)
    with open(run / "metrics.jsonl", "a") as f:  # the untrained model's validation, far above the rest
        f.write('{"kind": "val", "step": 0, "val_bpb": 9.5, "train_time_ms": 0}\n')
    fig = draw_runs([run])
    ax_val, ax_train = fig.axes
    assert ax_val.get_ylim()[1] < 3.0  # the rest spans 2.5 (the final score) .. 2.8
    raw, smoothed = ax_train.get_lines()
    assert list(smoothed.get_ydata()) == pytest.approx(smooth(list(raw.get_ydata())))
    assert smooth([4.0, 2.0]) == pytest.approx([4.0, (0.9 * 4.0 + 2.0) / 1.9])  # weights 0.9 and 1


@pytest.mark.slow
def test_the_plot_format_follows_the_file_name(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [fake_run(tmp_path / "a", curve=4)]
    assert b"<svg" in plot_runs(runs, tmp_path / "c.svg").read_bytes()[:500]
    assert plot_runs(runs, tmp_path / "c.PDF").read_bytes()[:5] == b"%PDF-"
    with pytest.raises(PgolfError, match=r"must end in \.png, \.svg, \.pdf"):
        plot_runs(runs, tmp_path / "c.jpg")
    assert not (tmp_path / "c.jpg").exists()


def test_records_reach_a_tracker_with_wandbs_api(tmp_path, monkeypatch):
    """wandb and trackio share init / log / finish: a stand-in module records what it is given."""
    import importlib.machinery
    import sys
    import types

    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kwargs: calls.append(("init", kwargs))
    fake.log = lambda values, step: calls.append(("log", values, step))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    from core.train.report import open_reporters, report_targets

    run = RunDir(tmp_path, "r")
    run.reporters = open_reporters(report_targets("wandb"), run.path, run.run_id, {"seed": 7})
    run.metric({"kind": "start", "step": 0, "backend": "cuda"})  # nothing to plot: not sent
    run.metric({"kind": "train", "step": 3, "train_loss": 4.5, "train_time_ms": 10.0, "mfu": None})
    run.metric({"kind": "final", "steps": 3, "train_time_ms": 10.0, "roundtrip_val_bpb": 2.25, "artifact_bytes": 9,
                "code_bytes": 1, "run_dir": "x"})  # fmt: skip
    run.close()
    assert calls == [
        ("init", {"project": "pgolf", "name": "r", "config": {"seed": 7}}),
        ("log", {"train/train_loss": 4.5, "train/train_time_ms": 10.0}, 3),
        (
            "log",
            {
                "final/train_time_ms": 10.0,
                "final/roundtrip_val_bpb": 2.25,
                "final/artifact_bytes": 9.0,
                "final/code_bytes": 1.0,
            },
            3,
        ),
        ("finish",),
    ]
    assert len(read_metrics(run.path)) == 3  # the log file has every record
