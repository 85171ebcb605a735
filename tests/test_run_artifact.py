"""`package` refuses a run whose artifact is not the file the run wrote (core/runs/run_artifact.py): the
size its final record and train.log give, the SHA-256 its final record gives."""

from __future__ import annotations

import json

import pytest

from core.common.errors import PgolfError
from core.common.files import file_sha256
from core.config.fields import Config
from core.runs.package import write_record
from core.runs.run_artifact import check_run_artifact
from tests.support.runs import fake_run


def logged(folder, **final):
    """Rewrite the run's final record with `final`'s fields over it."""
    record = json.loads((folder / "metrics.jsonl").read_text()) | final
    (folder / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def test_the_runs_own_artifact_passes(tmp_path):
    run = fake_run(tmp_path / "a", Config(seed=1), artifact=10, log="log")
    artifact = run / "final_model.int8.pgolf"
    assert check_run_artifact(run, Config(seed=1)) == artifact
    logged(run, artifact_sha256=file_sha256(artifact))
    (run / "train.log").write_text("Serialized model int8+zlib: 10 bytes\n")
    assert check_run_artifact(run, Config(seed=1)) == artifact


def test_an_artifact_swapped_for_another_runs_is_refused_by_package(tmp_path):
    """Its README gave two byte counts for that seed: the final record's and the audit's (the file's)."""
    a = fake_run(tmp_path / "a", Config(seed=1), artifact=10, log="log")
    b = fake_run(tmp_path / "b", Config(seed=2), artifact=10, log="log")
    (b / "final_model.int8.pgolf").write_bytes(b"another run's artifact")
    with pytest.raises(
        PgolfError, match=r"holds 22 bytes but its final record says the run wrote 10: not this"
    ):
        write_record([a, b], tmp_path / "out", "x")
    assert not (tmp_path / "out").exists()


def test_an_artifact_of_the_same_size_but_other_bytes_is_refused_by_its_hash(tmp_path):
    run = fake_run(tmp_path / "a", Config(seed=1), artifact=10, log="log")
    logged(run, artifact_sha256=file_sha256(run / "final_model.int8.pgolf"))
    (run / "final_model.int8.pgolf").write_bytes(b"9876543210")
    with pytest.raises(PgolfError, match="is not the file the run wrote: SHA-256"):
        check_run_artifact(run, Config(seed=1))


def test_a_log_that_gives_another_size_or_no_artifact_is_refused(tmp_path):
    run = fake_run(tmp_path / "a", Config(seed=1), artifact=10, log="log")
    (run / "train.log").write_text("Serialized model int8+zlib: 11 bytes\n")
    with pytest.raises(PgolfError, match="but its train.log says the run wrote 11"):
        check_run_artifact(run, Config(seed=1))
    (run / "final_model.int8.pgolf").unlink()
    with pytest.raises(PgolfError, match="has no artifact final_model.int8.pgolf"):
        check_run_artifact(run, Config(seed=1))
