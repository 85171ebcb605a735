"""Checkpoints: framework-neutral, exact, atomic, and refused cleanly when damaged."""

from __future__ import annotations

import time

import numpy as np
import pytest

from core.artifact.checkpoint import save_checkpoint
from core.artifact.load import is_checkpoint, load_checkpoint
from core.common.errors import PgolfError
from core.common.files import make_dir, write_atomic
from core.config.fields import Config
from core.runs.summary import read_metrics
from core.train.loop import _shared_run_id
from core.train.rundir import RunDir
from tests.support.artifacts import make_checkpoint, rewrite_metadata


def test_round_trip_is_exact(tmp_path):
    ckpt = make_checkpoint()
    path = save_checkpoint(tmp_path / "c.safetensors", ckpt)
    assert is_checkpoint(path)
    back = load_checkpoint(path)
    assert back.params.keys() == ckpt.params.keys()
    assert all(np.array_equal(back.params[k], v) for k, v in ckpt.params.items())
    assert all(np.array_equal(back.optimizer[k], v) for k, v in ckpt.optimizer.items())
    assert (back.step, back.train_time_ms, back.data_state, back.config) == (
        ckpt.step, ckpt.train_time_ms, ckpt.data_state, ckpt.config,
    )  # fmt: skip
    # Same content, same bytes: checkpoints can be compared by hash.
    again = save_checkpoint(tmp_path / "d.safetensors", ckpt)
    assert again.read_bytes() == path.read_bytes()


def test_damaged_checkpoints_are_one_clear_error(tmp_path):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    blob = path.read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "garbage.safetensors").write_bytes(b"not a checkpoint at all")
    (tmp_path / "header-cut.safetensors").write_bytes(blob[:40])  # inside its JSON header
    for name, problem in [("truncated.safetensors", "truncated"), ("header-cut.safetensors", "truncated"),
                          ("garbage.safetensors", "not a pgolf checkpoint")]:  # fmt: skip
        with pytest.raises(PgolfError, match=f"{name}: {problem}"):
            load_checkpoint(tmp_path / name)
    with pytest.raises(PgolfError, match="cannot read"):
        load_checkpoint(tmp_path / "missing.safetensors")
    # A damaged checkpoint is still read as one (by its name), never as a damaged artifact.
    assert is_checkpoint(tmp_path / "header-cut.safetensors")
    (tmp_path / "garbage.bin").write_bytes(b"not a checkpoint at all")
    assert not is_checkpoint(tmp_path / "garbage.bin")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: {**m, "step": "abc"}, "'step' must be a whole number"),
        (lambda m: {**m, "step": -2}, "'step' must be a whole number"),
        (lambda m: {k: v for k, v in m.items() if k != "step"}, "'step' must be a whole number"),
        (lambda m: {**m, "config": [1]}, "'config' must be an object"),
        (lambda m: {**m, "train_time_ms": "soon"}, "'train_time_ms' must be a number"),
        (lambda m: {**m, "data_state": 7}, "'data_state' must be an object"),
        (lambda m: [m], "not a pgolf checkpoint"),
    ],
)
def test_malformed_metadata_is_one_clear_error(tmp_path, change, message):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    rewrite_metadata(path, change)
    with pytest.raises(PgolfError, match=message):
        load_checkpoint(path)


def test_a_changed_tensor_byte_is_caught_by_the_checksum(tmp_path):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0x01  # one bit of the last tensor's data: still a valid safetensors file
    path.write_bytes(bytes(blob))
    with pytest.raises(PgolfError, match="does not match its checksum"):
        load_checkpoint(path)


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    before = path.read_bytes()
    bad = make_checkpoint()
    bad.params["tok_emb.weight"] = object()  # cannot be serialised
    with pytest.raises(Exception):  # noqa: B017 - any failure will do; the point is the file
        save_checkpoint(path, bad)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_unwritable_targets_are_one_clear_error(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    for target, message in [
        (tmp_path / "a_folder", "Is a directory"),
        (tmp_path / "a_file" / "out.bin", "cannot write"),
        (tmp_path / "..", "not a file name"),
    ]:
        with pytest.raises(PgolfError, match=message):
            write_atomic(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "a_folder"]
    assert list((tmp_path / "a_folder").iterdir()) == []
    with pytest.raises(PgolfError, match="cannot create folder"):
        make_dir(tmp_path / "a_file" / "sub")


def test_run_dir_layout(tmp_path):
    run = RunDir(tmp_path, "demo")
    run.write_config({"iterations": 3})
    run.metric({"kind": "train", "step": 1, "train_loss": 5.0, "train_time_ms": 10.0})
    run.metric({"kind": "val", "step": 1, "val_bpb": 2.0, "train_time_ms": 10.0})
    run.log_line("hello")
    assert (tmp_path / "demo" / "config.json").exists() and (tmp_path / "demo" / "checkpoints").is_dir()
    assert [r["kind"] for r in read_metrics(run.path)] == ["train", "val"]
    assert (tmp_path / "demo" / "train.log").read_text() == "hello\n"
    silent = RunDir(tmp_path, "other-rank", enabled=False)
    silent.metric({"kind": "train"})
    assert not (tmp_path / "other-rank").exists()


def test_a_run_directory_holding_a_run_is_refused_unless_resuming(tmp_path):
    first = RunDir(tmp_path, "demo")
    first.write_config({"iterations": 3})
    first.close()
    with pytest.raises(PgolfError, match="already holds a run"):
        RunDir(tmp_path, "demo")
    assert RunDir(tmp_path, "demo", reuse=True).path == tmp_path / "demo"
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(PgolfError, match="cannot create run directory"):
        RunDir(tmp_path / "a-file", "demo")


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    class OneProcess:
        rank = 0

        def all_reduce_sum(self, values):
            return np.asarray(values, dtype=np.float64)

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    cfg = Config(out_dir=str(tmp_path))
    names = []
    for _ in range(3):
        names.append(_shared_run_id(cfg, OneProcess()))
        RunDir(tmp_path, names[-1]).write_config({})
    assert names[1] == names[0] + "-1" and names[2] == names[0] + "-2"
    assert _shared_run_id(cfg.replace(run_id="mine"), OneProcess()) == "mine"
