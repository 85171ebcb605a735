"""`audit`'s calibration check (core/runs/audit.py `check_calibration`): the files a record names, links
resolved, against the run's own validation shards by identity and content wherever they live; a record
naming files that do not exist; a GPTQ run with no record, or an empty one."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from core.config.presets import preset
from core.runs.audit import check_calibration
from tests.support.runs import fake_run, made_audit


@pytest.fixture
def run(tmp_path):
    """A GPTQ run's artifact path and config, and its data folder (two training shards, one validation
    shard, each its own bytes)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("fineweb_train_000000.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"):
        (data / name).write_bytes(name.encode() * 10)
    cfg = preset("smoke").replace(data_path=str(data), quant_format="mixed", gptq_enabled=True)
    return fake_run(tmp_path / "run", cfg) / "final_model.mixed.pgolf", cfg


def record(artifact, data_path, gptq, fit=()):
    artifact.with_suffix(".calibration.json").write_text(
        json.dumps(
            {
                "data_path": str(data_path),
                "gptq_shards": list(gptq),
                "gptq_batches": 2,
                "fit_shards": list(fit),
            }
        )
    )


def test_its_own_training_shards_pass(run):
    artifact, cfg = run
    record(artifact, cfg.data_path, ["fineweb_train_000000.bin", "fineweb_train_000001.bin"])
    found = check_calibration(artifact, cfg)
    assert found.legal and found.status == "training shards only" and found.problem() == ""


@pytest.mark.parametrize("how", ["link", "copy"])
def test_a_validation_shard_in_another_folder_under_a_training_name_fails(run, tmp_path, how):
    """The record names a folder of its own where fineweb_train_000000.bin is the run's validation shard
    (a link, or a copy), beside a decoy fineweb_val_000000.bin: it passed as "training shards only"."""
    artifact, cfg = run
    other = tmp_path / "other"
    other.mkdir()
    (other / "fineweb_val_000000.bin").write_bytes(b"decoy")
    val = f"{cfg.data_path}/fineweb_val_000000.bin"
    if how == "link":
        (other / "fineweb_train_000000.bin").symlink_to(val)
    else:
        shutil.copy(val, other / "fineweb_train_000000.bin")
    record(artifact, other, ["fineweb_train_000000.bin"])
    found = check_calibration(artifact, cfg)
    assert (
        found.status == "reads other files" and found.bad == ["fineweb_train_000000.bin"] and not found.legal
    )
    # the folder evaluated is the run's, wherever its config says it was
    moved = preset("smoke").replace(data_path="/nonexistent", gptq_enabled=True, quant_format="mixed")
    assert check_calibration(artifact, moved, cfg.data_path).bad == ["fineweb_train_000000.bin"]


@pytest.mark.parametrize(
    ("data_path", "names"),
    [("/nonexistent/folder", ["fineweb_train_000000.bin"]), (None, ["fineweb_train_000009.bin"])],
    ids=["no-folder", "no-file"],
)
def test_a_record_naming_files_that_do_not_exist_fails(run, data_path, names):
    artifact, cfg = run
    record(artifact, data_path or cfg.data_path, names)
    found = check_calibration(artifact, cfg)
    assert found.status == "names missing files" and found.bad == names and not found.legal
    assert "names files that do not exist: " + names[0] in found.problem()


def test_a_gptq_run_needs_a_record_naming_its_files_and_a_run_without_gptq_none(run):
    artifact, cfg = run
    assert check_calibration(artifact, cfg).status == "not recorded"  # deleted, or never written
    assert not check_calibration(artifact, cfg).legal
    record(artifact, cfg.data_path, [])
    empty = check_calibration(artifact, cfg)
    assert empty.status == "empty" and not empty.legal and "names no file" in empty.problem()
    plain = cfg.replace(gptq_enabled=False)
    assert check_calibration(artifact, plain).legal
    artifact.with_suffix(".calibration.json").unlink()
    assert check_calibration(artifact, plain).status == "none" and check_calibration(artifact, plain).legal


def test_the_audits_verdict_names_the_calibrations_problem(run, tmp_path):
    artifact, cfg = run
    audit = made_audit(tmp_path, None)
    failed = dataclasses.replace(audit, calibration=check_calibration(artifact, cfg))
    assert (
        not failed.legal
        and failed.verdict() == "the run used GPTQ or a fit but its calibration record is missing"
    )
