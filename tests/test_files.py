"""Files: data prepare interrupted anywhere, temporary files, fsync, naming what failed, output paths
refused before any work, and the names of an artifact fit's files."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
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
    file_sha256,
    parse_json,
    read_json,
    read_text,
    text_lines,
    write_atomic,
)
from core.data.manifest import find_entries, read_manifest, shard_digests, verify_dataset
from core.data.shards import find_shards
from core.data.tokenizer import load_tokenizer
from core.datasets import prepare
from core.datasets.embedded import paragraphs, speech_files
from core.datasets.embedded import read_text as read_speech
from core.datasets.prepare import prepare_docs
from core.runs.setup import export_setup
from core.train.fitting import fit_files
from core.train.rundir import RunDir
from tests.support.artifacts import make_checkpoint, small_artifact
from tests.support.cli import assert_one_line_error, cli, cli_after
from tests.support.fuzz import run_within

# ------------------------------------------------- 8. data prepare, stopped anywhere
# What a prepare of dataset "d" (over one of vocabulary 400) leaves when stopped after each step: the
# version the manifest lists and the one the link datasets/d names.
SWITCH_LEAVES = {
    "checked": ("old", "old"),
    "staged": ("old", "old"),
    "tokenizer linked": ("old", "old"),
    "moved": ("old", "old"),
    "manifest written": ("new", "old"),
    "dataset linked": ("new", "new"),
    "old removed": ("new", "new"),
}
assert tuple(SWITCH_LEAVES) == prepare.SWITCH_STEPS


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    """Documents, a data folder holding dataset d made from them at vocabulary 400, and the fingerprints
    (shards' digests, tokenizer's) of d at 400 ("old") and at 512 ("new"), made apart."""
    base = tmp_path_factory.mktemp("switch")
    docs = base / "docs.jsonl"
    docs.write_text(
        "".join(
            json.dumps({"text": t}) + "\n" for t in paragraphs(read_speech(f) for f in speech_files()[:3])
        )
    )
    old, new = base / "old", base / "new"
    prepare_docs(docs, old, "d", 400, val_docs=5)
    prepare_docs(docs, new, "d", 512, val_docs=5)
    return docs, old, {"old": listed_version(old), "new": listed_version(new)}


def listed_version(root: Path) -> tuple:
    """(shard digests, tokenizer digest) of dataset d as the manifest lists it, checked whole."""
    entry, tokenizer = find_entries(read_manifest(root), "d")
    assert verify_dataset(root, "d")["hashed"] == len(entry["sha256"])
    assert file_sha256(root / tokenizer["model_path"], "tokenizer") == entry["tokenizer_sha256"]
    return entry["sha256"], entry["tokenizer_sha256"]


def linked_version(root: Path) -> tuple:
    """(shard digests, tokenizer digest) of what the fixed paths datasets/d and tokenizers/d.model name."""
    model, vocab = root / "tokenizers" / "d.model", root / "tokenizers" / "d.vocab"
    if model.is_symlink():  # else still as an older pgolf left it
        assert model.resolve().parent == vocab.resolve().parent == (root / "datasets" / "d").resolve()
    return shard_digests(root / "datasets" / "d"), file_sha256(model, "tokenizer")


def assert_stopped_whole(root: Path, versions: dict, step: str, docs: Path) -> None:
    listed, linked = SWITCH_LEAVES[step]
    assert listed_version(root) == versions[listed]
    assert linked_version(root) == versions[linked]
    result = cli("data", "verify", "d", "--out", str(root))
    assert result.returncode == 0, result.stderr
    prepare_docs(docs, root, "d", 512, val_docs=5)  # the next prepare works, and clears what was left
    assert listed_version(root) == linked_version(root) == versions["new"]
    assert sorted(p.name for p in root.iterdir()) == ["datasets", "manifest.json", "tokenizers"]
    assert len(list((root / "datasets").iterdir())) == 2  # the link and the one folder it names
    assert sorted(p.name for p in (root / "tokenizers").iterdir()) == ["d.model", "d.vocab"]


@pytest.mark.slow  # ~2 s a case: a process of its own each
@pytest.mark.parametrize("step", prepare.SWITCH_STEPS)
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGINT"])
def test_a_prepare_stopped_at_any_step_leaves_the_old_dataset_or_the_new_one_whole(
    switch, tmp_path, stop, step
):
    """kill -9 or Ctrl-C after each step of a prepare that replaces a dataset (its tokenizer too): the
    manifest and the link each name a whole dataset with its own tokenizer, and `data verify` passes.
    Ctrl-C waits for the switch's renames: from the tokenizer's link on, it leaves the new dataset."""
    docs, old, versions = switch
    root = tmp_path / "data"
    shutil.copytree(old, root, symlinks=True)
    hook = f"""
import os, signal
from core.datasets import prepare
def at_step(step):
    if step == {step!r}:
        os.kill(os.getpid(), signal.{stop})
prepare.at_step = at_step
"""
    result = cli_after(hook, "data", "prepare", "--docs", str(docs), "--vocab-size", "512", "--val-docs", "5",
                       "--name", "d", "--out", str(root))  # fmt: skip
    if stop == "SIGKILL":
        assert result.returncode == -signal.SIGKILL, result.stderr
        assert_stopped_whole(root, versions, step, docs)
    else:
        assert result.returncode == 130 and result.stderr.strip() == "interrupted", result.stderr
        held = prepare.SWITCH_STEPS.index("tokenizer linked") <= prepare.SWITCH_STEPS.index(step)
        assert_stopped_whole(root, versions, "old removed" if held else "checked", docs)


class Failed(Exception):
    """Stands for a write that fails at one step (a full disk)."""


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["this pgolf's", "an older pgolf's"])
def test_a_prepare_that_fails_at_any_step_leaves_the_old_dataset_or_the_new_one_whole(
    switch, tmp_path, monkeypatch, layout
):
    """A write that fails after each step, over data this pgolf made and over data an older one made
    (a plain dataset folder, the tokenizer's files in tokenizers/, the manifest naming both)."""
    docs, old, versions = switch
    for step in prepare.SWITCH_STEPS:
        root = tmp_path / step
        shutil.copytree(old, root, symlinks=True)
        if layout == "an older pgolf's":
            older_layout(root)
        monkeypatch.setattr(prepare, "at_step", lambda at, step=step: at == step and throw(Failed(at)))
        with pytest.raises(Failed):
            prepare_docs(docs, root, "d", 512, val_docs=5)
        monkeypatch.undo()
        assert_stopped_whole(root, versions, step, docs)


def throw(exc: BaseException):
    raise exc


def older_layout(root: Path) -> None:
    """Data folder `root` as pgolf wrote it before datasets were versioned: datasets/d a folder, the
    tokenizer's files in tokenizers/, the manifest naming them there."""
    folder = (root / "datasets" / "d").resolve()
    (root / "datasets" / "d").unlink()
    folder.rename(root / "datasets" / "d")
    for suffix in (".model", ".vocab"):
        link = root / "tokenizers" / f"d{suffix}"
        link.unlink()
        (root / "datasets" / "d" / f"d{suffix}").rename(link)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["datasets"][0]["path"] = "datasets/d"
    manifest["tokenizers"][0]["model_path"] = "tokenizers/d.model"
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_what_a_prepare_would_replace_is_checked_before_any_work(switch, tmp_path, monkeypatch):
    """A damaged manifest, a folder where the tokenizer's .vocab goes, a tokenizer name another dataset
    uses: refused before the tokenizer is trained, the data folder as it was."""
    docs, old, _ = switch
    monkeypatch.setattr(prepare, "export_documents", lambda *a, **k: throw(AssertionError("work began")))
    cases = {
        "damaged manifest": (
            lambda root: (root / "manifest.json").write_text('{"datasets": [[['),
            "manifest",
        ),
        "folder for .vocab": (
            lambda root: (
                (root / "tokenizers" / "d.vocab").unlink(),
                (root / "tokenizers" / "d.vocab").mkdir(),
            ),
            "something else is in its place",
        ),
        "another's tokenizer": (lambda root: rename_dataset(root, "other"), "lists it as dataset other's"),
        "another's tokenizer file": (
            lambda root: downloaded_tokenizer(root, "d"),
            "as tokenizer sp_bpe_1024's file",
        ),
    }
    for case, (damage, says) in cases.items():
        root = tmp_path / case.replace(" ", "_").replace("'", "")
        shutil.copytree(old, root, symlinks=True)
        damage(root)
        before = snapshot(root)
        with pytest.raises(PgolfError, match=says):
            prepare_docs(docs, root, "d", 512, val_docs=5)
        assert snapshot(root) == before, case


def rename_dataset(root: Path, name: str) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["datasets"][0]["name"] = name
    (root / "manifest.json").write_text(json.dumps(manifest))


def downloaded_tokenizer(root: Path, name: str) -> None:
    """The manifest also lists a downloaded tokenizer whose file is tokenizers/<name>.model (the challenge's
    tokenizer entries are named otherwise than their files)."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["tokenizers"].append({"name": "sp_bpe_1024", "model_path": f"tokenizers/{name}.model"})
    (root / "manifest.json").write_text(json.dumps(manifest))


def snapshot(root: Path) -> dict:
    """Every path under `root` with what it holds: a file's bytes, a link's target, a folder."""
    return {
        str(p.relative_to(root)): os.readlink(p)
        if p.is_symlink()
        else p.read_bytes()
        if p.is_file()
        else "folder"
        for p in root.rglob("*")
    }


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


@pytest.mark.slow
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
