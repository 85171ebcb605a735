"""core/runs/setup.py: what a command works out before it runs (no framework, no training)."""

from __future__ import annotations

import re

import pytest

from core.common.errors import PgolfError
from core.config.fields import Config
from core.config.presets import preset
from core.config.sources import resolve_sources
from core.runs import setup


def test_a_challenge_preset_on_the_embedded_corpus_warns():
    cfg, sources = resolve_sources("baseline", environ={})
    assert any(
        "made for the challenge's FineWeb data" in n for n in setup.train_notes("baseline", cfg, sources)
    )
    assert setup.train_notes("tiny", cfg, sources) == []
    assert setup.train_notes(None, cfg, sources) == []  # a resumed run: its preset is not known
    fineweb, sources = resolve_sources("baseline", overrides={"data_path": "data/datasets/fineweb10B_sp1024"})
    assert setup.train_notes("baseline", fineweb, sources) == []


def test_the_environment_is_noted():
    cfg, sources = resolve_sources("tiny", environ={"ITERATIONS": "12"})
    assert setup.train_notes("tiny", cfg, sources) == ["from the environment: iterations=12 (ITERATIONS)"]


def test_seeds_make_one_group_of_runs():
    cfg = preset("tiny").replace(run_group="lr")
    runs = setup.seed_configs(cfg, "3, 1,")
    assert [(c.seed, c.run_group, c.run_id) for c in runs] == [(3, "lr", "lr-seed3"), (1, "lr", "lr-seed1")]
    assert setup.seed_configs(preset("tiny").replace(run_id="x"), "5")[0].run_id == "x-seed5"
    for bad in ("1,1", ",", "1,a", "1.5"):
        with pytest.raises(PgolfError, match="--seeds must"):
            setup.seed_configs(cfg, bad)


def test_seeds_and_resume_do_not_go_together(tmp_path):
    with pytest.raises(PgolfError, match="--seeds starts new runs: it cannot go with --resume"):
        setup.training_runs("cuda", "tiny", None, {}, resume=tmp_path, seeds="1,2")


def test_the_default_data_is_prepared_by_local_rank_0_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    cfg = Config()
    assert setup.default_data_to_prepare(cfg) == setup.DEFAULT_DATA_ROOT
    assert setup.default_data_to_prepare(cfg.replace(data_path=str(tmp_path / "other"))) is None
    for name, value in {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(name, value)  # torchrun's second process
    monkeypatch.setattr(setup, "DATA_WAIT_S", 0.0)
    with pytest.raises(PgolfError, match=r"local rank 0 has not prepared .* run `cli.py data prepare`"):
        setup.default_data_to_prepare(cfg)
    (tmp_path / cfg.data_path).mkdir(parents=True)  # in place: nothing to do, on any rank
    assert setup.default_data_to_prepare(cfg) is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert setup.default_data_to_prepare(cfg) is None


def test_export_changes_only_the_artifact_settings(checkpoint, tmp_path):
    job = setup.export_setup(checkpoint, None, "pgolf", {"matrix_bits": 6, "quant_format": "mixed"})
    assert (job.cfg.matrix_bits, job.cfg.model_dim, job.upstream) == (6, preset("tiny").model_dim, False)
    assert job.target == checkpoint.with_suffix(".int6.pgolf")  # named by its matrices' bits
    assert job.params["w"].tolist() == [[2.0] * 3] * 2  # the moving average, as train exports
    assert job.dtypes == {"w": "bf16"}
    upstream = setup.export_setup(checkpoint, tmp_path / "a.ptz", "upstream", None)
    assert (upstream.target, upstream.upstream) == (tmp_path / "a.ptz", True)
    refused = (
        ("zip", {}, "unknown export format 'zip' (choose pgolf or upstream)"),
        (
            "pgolf",
            {"model_dim": 64},
            "--model-dim cannot change (only the artifact, data and execution settings",
        ),
        ("upstream", {"matrix_bits": 6, "quant_format": "mixed"}, "int8 + zlib only"),
    )
    for format, overrides, message in refused:
        with pytest.raises(PgolfError, match=re.escape(message)):
            setup.export_setup(checkpoint, None, format, overrides)
    with pytest.raises(PgolfError, match="is the checkpoint itself"):
        setup.export_setup(checkpoint, checkpoint, "pgolf", {})
