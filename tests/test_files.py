"""Files: data prepare interrupted anywhere, temporary files, fsync, naming what failed, output paths
refused before any work, and the names of an artifact fit's files."""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.artifact.checkpoint import save_checkpoint
from core.common.errors import PgolfError
from core.common.files import write_atomic
from core.data.manifest import read_manifest
from core.data.shards import find_shards, read_shard
from core.data.tokenizer import load_tokenizer
from core.datasets.embedded import prepare_sotu
from core.runs.setup import export_setup
from core.train.fitting import fit_files
from core.train.rundir import RunDir
from tests.helpers import (
    assert_one_line_error,
    cli,
    make_checkpoint,
    small_artifact,
)


# ------------------------------------------------- 8. data prepare, interrupted anywhere
class Interrupt(BaseException):
    """Stands for a kill at one file operation."""


@pytest.mark.slow  # ~4 s
def test_an_interrupted_prepare_always_leaves_a_listed_dataset_whole(tmp_path, monkeypatch):
    """An interruption at each file operation of a second `data prepare` in turn (and of a first
    one): every dataset the manifest lists is present with its shards, and the next prepare works."""
    prepare = functools.partial(prepare_sotu, vocab_size=512, limit_docs=20)
    prepare(tmp_path / "old")
    counted = {"n": 0, "at": -1}

    def interrupting(real):
        def operation(*args, **kwargs):
            counted["n"] += 1
            if counted["n"] == counted["at"]:
                raise Interrupt
            return real(*args, **kwargs)

        return operation

    for name in ("replace", "rename", "symlink"):
        monkeypatch.setattr(os, name, interrupting(getattr(os, name)))
    for root in (tmp_path / "old", tmp_path / "new"):
        at = 1
        while True:
            counted.update(n=0, at=at)
            try:
                prepare(root)
                break
            except Interrupt:
                pass
            for dataset in read_manifest(root)["datasets"]:
                folder = root / dataset["path"]
                assert [len(read_shard(f)) > 0 for s in ("val", "train") for f in find_shards(folder, s)]
            at += 1
        assert at > 5  # the tokenizer, the shards, the link and the manifest were each cut short
        counted["at"] = -1
        prepare(root)
        assert len(list((root / "datasets").iterdir())) == 2  # the link and the one folder it names


# ------------------------------------------------- 9. temp files, fsync, and naming what failed
def test_a_killed_writers_temp_files_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".a.bin.pgolf-{int(dead.stdout)}-x1y2.tmp"
    live = tmp_path / f".b.bin.pgolf-{os.getpid()}-x1y2.tmp"  # a writer still at work
    other = tmp_path / ".notes.tmp"  # not pgolf's
    for path in (stale, live, other):
        path.write_bytes(b"half")
    write_atomic(tmp_path / "c.bin", b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.bin", live.name, other.name])


def test_writes_are_synced_to_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    small_artifact(tmp_path / "a.pgolf")
    assert events == ["fsync file", "rename", "fsync folder"] * 2


def test_unreadable_folders_and_tokenizers_are_named_as_such(sotu_dataset, tmp_path, monkeypatch):
    real_listdir, real_open = os.listdir, os.open

    def denied(path, *args):
        if str(path) in (str(sotu_dataset.data_path), str(sotu_dataset.tokenizer_path)):
            raise PermissionError(13, "Permission denied", str(path))
        return (real_listdir if not args else real_open)(path, *args)

    monkeypatch.setattr(os, "listdir", denied)
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PgolfError, match=r"dataset folder .*sotu_sp1024: cannot read \(Permission denied\)"):
        find_shards(sotu_dataset.data_path, "train")
    with pytest.raises(
        PgolfError, match=r"tokenizer .*sotu_1024_bpe.model: cannot read \(Permission denied\)"
    ):
        load_tokenizer(sotu_dataset.tokenizer_path)


def test_a_full_disk_while_logging_names_the_file(tmp_path):
    run = RunDir(tmp_path, "r")
    for name in ("metrics.jsonl", "train.log"):
        (run.path / name).symlink_to("/dev/full")  # every write there fails with ENOSPC
    with pytest.raises(PgolfError, match=r"cannot write .*metrics.jsonl: No space left on device"):
        run.metric({"kind": "train"})
    with pytest.raises(PgolfError, match=r"cannot write .*train.log: No space left on device"):
        run.log_line("step:1")


# ------------------------------------------------- output paths, before any work
def test_export_refuses_an_output_it_cannot_write_before_reading_the_checkpoint(tmp_path):
    missing = tmp_path / "none.safetensors"  # read after the check: never reached
    for out, message in (
        (tmp_path, "a folder, not a file"),
        (tmp_path / "no" / "a.pgolf", "cannot write there: .* does not exist"),
        (Path("/proc/a.pgolf"), r"cannot write in /proc \("),
    ):
        with pytest.raises(PgolfError, match=f"--out {out}: {message}"):
            export_setup(missing, out, "pgolf", {"artifact_fit_bytes": 100_000})


@pytest.mark.slow  # two CLI starts: ~6 s
def test_fit_bytes_into_a_folder_and_token_losses_into_proc_are_refused_at_once(tmp_path):
    checkpoint = tmp_path / "c.safetensors"
    from core.artifact.checkpoint import save_checkpoint

    save_checkpoint(checkpoint, make_checkpoint())
    start = time.monotonic()
    result = cli("export", str(checkpoint), "--fit-bytes", "100000", "--out", str(tmp_path))
    assert_one_line_error(result, f"--out {tmp_path}: a folder, not a file")
    result = cli("eval", str(checkpoint), "--save-token-losses", "/proc/x.npz")
    assert_one_line_error(result, "--save-token-losses /proc/x.npz: cannot write in /proc")
    assert time.monotonic() - start < 60


# ------------------------------------------------- a fit's files are named as documented
def test_a_fits_files_are_named_after_the_whole_artifact_name():
    artifact = Path("runs/r/final_model.int6.pgolf")
    assert fit_files(artifact) == (
        Path("runs/r/final_model.int6.pgolf.fit.json"),
        Path("runs/r/final_model.int6.pgolf.fit.toml"),
    )
