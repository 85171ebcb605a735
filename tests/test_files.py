"""Files: data prepare interrupted anywhere, temporary files, fsync, naming what failed, output paths
refused before any work, and the names of an artifact fit's files."""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.artifact.checkpoint import save_checkpoint
from core.common.errors import PgolfError
from core.common.files import (
    MAX_JSON_DEPTH,
    parse_json,
    read_json,
    read_text,
    text_lines,
    write_atomic,
)
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
    run_within,
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


# ------------------------------------------------- one guarded reader: text and JSON
JSON_HAZARDS = {
    "deep": "[" * 200_000 + "]" * 200_000,
    "deep but parsable": "[" * 70 + "]" * 70,
    "long integer": '{"a": ' + "9" * 5_000 + "}",
    "NaN": '{"a": NaN}',
    "Infinity": '{"a": -Infinity}',
    "overflow": '{"a": 1e400}',
    "lone surrogate": '{"text": "a\\ud800b"}',
    "not JSON": '{"a": ',
}


@pytest.mark.parametrize("hazard", JSON_HAZARDS)
def test_parse_json_refuses_each_hazard_in_one_line_naming_where(hazard):
    with pytest.raises(PgolfError) as caught:
        parse_json(JSON_HAZARDS[hazard], "manifest data/manifest.json")
    message = str(caught.value)
    assert message.startswith("manifest data/manifest.json: ") and "\n" not in message


def test_parse_json_keeps_ordinary_values_and_exact_decimals():
    assert parse_json('{"a": [1, 2.5, "é", null]}', "x") == {"a": [1, 2.5, "é", None]}
    assert parse_json('{"bpb": 1.06108}', "x", exact=True) == {"bpb": Decimal("1.06108")}
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(deep, "x") == functools.reduce(lambda inner, _: [inner], range(MAX_JSON_DEPTH - 1), [])


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids),
        max_leaves=20,
    )
)
@settings(max_examples=200, deadline=None)
def test_parse_json_reads_back_what_json_writes_or_refuses_in_one_line(value):
    """Any value json.dumps writes (NaN, infinities and lone surrogates included) is read back
    equal, or refused with a PgolfError: never another exception."""
    text = json.dumps(value)
    try:
        assert parse_json(text, "f") == json.loads(text)
    except PgolfError as exc:
        assert str(exc).startswith("f: ") and "\n" not in str(exc)


def not_regular_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero, dangling, folder = tmp_path / "zero.txt", tmp_path / "dangling.json", tmp_path / "dir.json"
    zero.symlink_to("/dev/zero")
    dangling.symlink_to(tmp_path / "nowhere")
    folder.mkdir()
    return {"fifo": fifo, "device": zero, "dangling link": dangling, "folder": folder}


def test_every_reader_refuses_what_is_not_a_regular_file_at_once(tmp_path):
    for kind, path in not_regular_files(tmp_path).items():
        for reader in (
            lambda p: read_json(p, "manifest", 1 << 20),
            lambda p: read_text(p, "log"),
            lambda p: list(text_lines(p, "documents")),
        ):
            result, error = run_within(5, lambda reader=reader, path=path: reader(path))
            assert isinstance(error, PgolfError), (kind, result, error)
            assert str(path) in str(error) and "\n" not in str(error)


def test_text_readers_name_the_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "b"}\n{"text": "\xff"}\n')
    lines = text_lines(path, "documents")
    assert [next(lines), next(lines)] == [(1, '{"text": "a"}'), (2, '{"text": "b"}')]
    with pytest.raises(PgolfError, match=r"documents .*docs\.jsonl: line 3 is not UTF-8"):
        next(lines)
    with pytest.raises(PgolfError, match=r"log .*docs\.jsonl: line 3 is not UTF-8"):
        read_text(path, "log")
