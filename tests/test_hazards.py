"""Every reader of a run's, a config's, a record's or a data folder's files against hostile input (a property test): brackets
nested 200,000 deep, an integer of thousands of digits, NaN and Infinity, bytes that are not UTF-8, a FIFO,
a link to /dev/zero. Each reader ends with one PgolfError line naming the file (check-record: a finding
naming it), never another exception, and never a hang."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.artifact.load import checkpoint_config, load_checkpoint, saved_config
from core.common.errors import PgolfError
from core.common.files import MAX_INT_DIGITS, MAX_JSON_DEPTH
from core.config.fields import Config
from core.config.sources import read_run_config, resolve
from core.data.manifest import dataset_settings, read_manifest
from core.datasets.prepare import read_documents
from core.runs.audit import check_calibration
from core.runs.record_folder import check_record
from core.runs.summary import read_metrics, val_curve
from core.runs.sweep import load_sweep
from tests.support.cli import assert_one_line_error, cli
from tests.support.fuzz import HANG_SECONDS, run_within
from tests.support.runs import fake_run, write_folder


@dataclass(frozen=True)
class Reader:
    """A reader of one file: its name, the text it holds with HAZARD where the hostile value goes, the
    format (json, toml or log: how a hazard is written there) and how the reader is called on the folder."""

    file: str
    template: str
    format: str
    read: Callable[[Path], object]


def _checkpoint_bytes(metadata: bytes) -> bytes:
    """A safetensors file of no tensors whose pgolf metadata is `metadata` (the checkpoint's header)."""
    header = b'{"__metadata__": {"pgolf": "' + metadata + b'"}}'
    return len(header).to_bytes(8, "little") + header


READERS = {
    "metrics": Reader("metrics.jsonl", '{"kind": "train", "step": 1, "train_time_ms": 1, "train_loss": 3}\n'
                      '{"kind": "val", "step": HAZARD, "train_time_ms": 1, "val_bpb": 2}\n'
                      '{"kind": "val", "step": 2, "train_time_ms": 2, "val_bpb": 1}\n', "json",
                      lambda d: read_metrics(d)),
    "abort-behind": Reader("metrics.jsonl", '{"kind": "val", "step": HAZARD, "train_time_ms": 1, "val_bpb": 2}\n'
                           '{"kind": "val", "step": 2, "train_time_ms": 2, "val_bpb": 1}\n', "json", val_curve),
    "run config": Reader("config.json", '{"seed": HAZARD}', "json", lambda d: read_run_config(d / "config.json")),
    "config beside an artifact": Reader("config.json", '{"seed": HAZARD}', "json",
                                        lambda d: saved_config(d / "final_model.int8.pgolf")),
    "config file (JSON)": Reader("c.json", '{"seed": HAZARD}', "json",
                                 lambda d: resolve("smoke", file_path=d / "c.json", environ={})),
    "config file (TOML)": Reader("c.toml", "seed = HAZARD\n", "toml",
                                 lambda d: resolve("smoke", file_path=d / "c.toml", environ={})),
    "sweep spec": Reader("spec.toml", 'preset = "smoke"\nseeds = [1, HAZARD]\n', "toml",
                         lambda d: load_sweep(d / "spec.toml", environ={})),
    "calibration record": Reader("final_model.int8.calibration.json",
                                 '{"data_path": "data", "gptq_shards": [HAZARD]}', "json",
                                 lambda d: check_calibration(d / "final_model.int8.pgolf", Config(gptq_enabled=True))),
    "checkpoint metadata": Reader("step_000001.safetensors", '{\\"format\\": \\"pgolf-checkpoint\\", '
                                  '\\"config\\": HAZARD}', "checkpoint",
                                  lambda d: checkpoint_config(d / "step_000001.safetensors")),
    "checkpoint": Reader("step_000001.safetensors", '{\\"format\\": \\"pgolf-checkpoint\\", \\"step\\": HAZARD}',
                         "checkpoint", lambda d: load_checkpoint(d / "step_000001.safetensors")),
    "submission.json": Reader("submission.json", '{"author": "a", "github_id": "a", "val_bpb": HAZARD}', "json",
                              check_record),
    "record's log": Reader("train_seed42.log", "seed: 42\nTotal submission size int6+brotli: 15915268 bytes\n"
                           "final_int6_sliding_window val_loss:HAZARD val_bpb:1.09743840\n", "log", check_record),
    "data manifest": Reader("manifest.json", '{"datasets": [], "tokenizers": [], "version": HAZARD}', "json",
                            lambda d: read_manifest(d)),
    "data manifest by --dataset": Reader("manifest.json", '{"datasets": [{"name": "x", "vocab_size": HAZARD}]}',
                                         "json", lambda d: dataset_settings("x", d)),
    "documents (JSON lines)": Reader("docs.jsonl", '{"text": "a"}\n{"text": "b", "n": HAZARD}\n', "json",
                                     lambda d: list(read_documents(d / "docs.jsonl"))),
}  # fmt: skip
HAZARDS = ("deep", "digits", "nan", "infinity", "utf-8", "fifo", "dev-zero")


def hazard_value(kind: str, size: int, form: str) -> bytes:
    """The hostile value as the format writes it (deep: `size` levels; digits: `size` digits)."""
    if kind == "deep":
        return ("[" * size + "]" * size).encode()
    if kind == "digits":
        return ("1" + "0" * (size - 1)).encode()
    if kind in ("nan", "infinity"):
        word = {"nan": "NaN", "infinity": "Infinity"}[kind]
        return (word.lower()[:3] if form == "toml" else word).encode()
    return b'"\xff\xfe"' if form != "checkpoint" else b'\\"\xff\xfe\\"'  # utf-8: bytes no text has


def write_hazard(folder: Path, reader: Reader, kind: str, size: int) -> Path:
    path = folder / reader.file
    if reader.read is check_record:
        write_folder(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero")
    else:
        data = reader.template.encode().replace(b"HAZARD", hazard_value(kind, size, reader.format))
        path.write_bytes(_checkpoint_bytes(data) if reader.format == "checkpoint" else data)
    return path


def _unblock(path: Path) -> Callable[[], None]:
    """Frees a reader stuck on the FIFO (the test fails anyway): a writer that closes at once."""

    def unblock() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    return unblock


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(sorted(READERS)),
    kind=st.sampled_from(HAZARDS),
    deep=st.integers(MAX_JSON_DEPTH + 1, 200_000),
    digits=st.integers(MAX_INT_DIGITS + 1, 6_000),
)
@example(name="metrics", kind="deep", deep=200_000, digits=5_000)
@example(name="submission.json", kind="digits", deep=200_000, digits=5_000)
@example(name="config file (TOML)", kind="digits", deep=200_000, digits=5_000)
@example(name="record's log", kind="digits", deep=200_000, digits=5_000)
def test_every_reader_refuses_a_hazard_in_one_line_naming_the_file(
    tmp_path_factory, name, kind, deep, digits
):
    reader = READERS[name]
    folder = tmp_path_factory.mktemp("hazard") / "folder"
    path = write_hazard(folder, reader, kind, deep if kind == "deep" else digits)
    result, raised = run_within(HANG_SECONDS, lambda: reader.read(folder), _unblock(path))
    if reader.read is check_record:  # a finding naming the file, each on one line
        assert raised is None, repr(raised)
        assert result and all("\n" not in line for line in result), result
        assert any(reader.file in line for line in result), (kind, result)
        return
    assert isinstance(raised, PgolfError), (name, kind, repr(raised), result)
    message = str(raised)
    assert "\n" not in message and reader.file in message, (name, kind, message)


@pytest.mark.parametrize("kind", ["deep", "digits", "fifo"])
def test_the_commands_say_it_in_one_error_line(tmp_path, kind):
    """Through the CLI: runs --compare --against a record whose submission.json and logs are hostile, and a run
    whose metrics are: each one `error:` line (the record's figures then come from nowhere)."""
    record = tmp_path / "record"
    write_hazard(record, READERS["submission.json"], kind, 200_000 if kind == "deep" else 5_000)
    for log in record.glob("*.log"):
        log.write_bytes(b"\xff\n")
    runs = tmp_path / "runs"
    for seed in (1, 2):
        fake_run(runs / f"r{seed}", {"seed": seed})
    result = cli("runs", "--out-dir", str(runs), "--compare", "r1", "r2", "--against", str(record))
    assert_one_line_error(result, str(record), "no per-seed val_loss and val_bpb")
    write_hazard(runs / "r2", READERS["metrics"], kind, 200_000 if kind == "deep" else 5_000)
    assert_one_line_error(cli("runs", "--out-dir", str(runs)), "metrics.jsonl")
