"""`data prepare --docs`: the challenge exporter's tokenizer and shards from the same documents (its golden,
tests/golden/make_challenge_export.py), documents read from JSON lines or .txt files, clear refusals, and
a stopped prepare that leaves the data folder as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.data.manifest import read_manifest
from core.datasets import prepare
from core.datasets.prepare import count_documents, prepare_docs, read_documents
from core.datasets.writers import available_memory, check_training_memory, training_memory
from tests.golden_data import (
    CHALLENGE_EXPORT,
    shard_sha256,
    tokenizer_digest,
    write_export_docs,
    write_train_docs_docs,
)
from tests.support.cli import assert_one_line_error, cli, cli_after


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(CHALLENGE_EXPORT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def export_docs(tmp_path_factory, golden) -> Path:
    import hashlib

    path = write_export_docs(tmp_path_factory.mktemp("docs") / "docs.jsonl")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["docs_sha256"]  # the golden's documents
    return path


def made(root: Path, name: str) -> dict:
    return {
        "tokenizer": tokenizer_digest(root / "tokenizers" / f"{name}.model"),
        "shards": shard_sha256(root / "datasets" / name),
    }


def test_the_exporters_tokenizer_and_shards(export_docs, golden, tmp_path):
    s = golden["settings"]
    prepare_docs(export_docs, tmp_path, "g", s["vocab_size"], s["val_docs"], s["shard_tokens"])
    assert made(tmp_path, "g") == golden["trained"]


@pytest.mark.filterwarnings("ignore:the tokenizer has no byte fallback")  # sp1024: <unk> for what it lacks
def test_the_exporters_shards_with_a_given_tokenizer(export_docs, golden, challenge_dir, tmp_path):
    s = golden["settings"]
    model = challenge_dir / "fineweb_1024_bpe.model"
    prepare_docs(export_docs, tmp_path, "r", None, s["val_docs"], s["shard_tokens"], tokenizer=model)
    assert made(tmp_path, "r") == golden["reused"]


def test_documents_from_a_folder_of_text_files(tmp_path):
    folder = tmp_path / "txt"
    folder.mkdir()
    for name, text in (("b.txt", "second\n"), ("a.txt", " first "), ("notes.md", "left out")):
        (folder / name).write_text(text, encoding="utf-8")
    assert count_documents(folder) == 2 and list(read_documents(folder)) == [" first ", "second\n"]


def test_bad_documents_and_settings_are_refused(tmp_path, export_docs):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(PgolfError, match=r'bad.jsonl line 2: not a JSON object with a "text" string'):
        list(read_documents(bad))
    with pytest.raises(PgolfError, match="no such file or folder"):
        count_documents(tmp_path / "absent.jsonl")
    total = count_documents(export_docs)
    with pytest.raises(PgolfError, match=f"holds {total:,} documents: --val-docs 50,000 must leave"):
        prepare_docs(export_docs, tmp_path / "data", "x", 512)
    assert not (tmp_path / "data").exists()


def test_a_stopped_prepare_leaves_the_data_folder_as_it_was(export_docs, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "export_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_docs(export_docs, tmp_path, "stopped", 512, val_docs=10)
    assert read_manifest(tmp_path)["datasets"] == []
    assert not (tmp_path / "datasets" / "stopped").exists()
    assert not list(tmp_path.glob(".staging-*")) and not list((tmp_path / "tokenizers").glob("*"))


@pytest.mark.slow
def test_the_commands(export_docs, tmp_path):
    out = tmp_path / "data"
    result = cli("data", "prepare", "--docs", str(export_docs), "--vocab-size", "512", "--val-docs", "30",
                 "--shard-tokens", "50000", "--name", "mine", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "documents: 30 validation + " in result.stdout and "byte tables are exact" in result.stdout
    verified = cli("data", "verify", "mine", "--bytes", "--out", str(out))
    assert verified.returncode == 0, verified.stderr
    first = verified.stdout.splitlines()[0].split()
    assert first[:2] == ["bytes:", "scoring"] and first[2] == first[4] and int(first[2]) > 10_000
    assert "challenge tables: " in verified.stdout and "+0.00%" in verified.stdout
    refused = cli("data", "prepare", "--name", "x", "--out", str(out))
    assert_one_line_error(refused, "--name goes with --docs")
    assert refused.returncode == 2  # a bad flag


# ------------------------------------------------- documents that are not documents, stops while training
GOOD = [
    json.dumps({"text": f"document {i}: " + "the union is strong and the people are free " * 8})
    for i in range(30)
]
BAD_LINES = {  # a line of a JSON-lines file: what the error says about it
    "malformed": ('{"text": "cut', "not valid JSON"),
    "no text": ('{"body": "x"}', 'not a JSON object with a "text" string'),
    "text a number": ('{"text": 5}', 'not a JSON object with a "text" string'),
    "blank": ("", "not valid JSON"),
    "raw NUL": ('{"text": "a\x00b"}', "not valid JSON (Invalid control character"),
    "lone surrogate": ('{"text": "a\\ud800b"}', "lone surrogate"),
    "deep brackets": ("[" * 200_000 + "]" * 200_000, "nested deeper than 64"),
    "huge integer": ('{"text": "x", "n": ' + "9" * 5000 + "}", "an integer of 5,000 digits"),
}
BAD_FILES = {  # a .txt document in a folder: how to put it there, what the error says
    "a folder": (lambda p: p.mkdir(), "is not a regular file"),
    "a dangling link": (lambda p: p.symlink_to(p.parent / "gone"), "cannot read (No such file"),
    "a FIFO": (lambda p: os.mkfifo(p), "is not a regular file"),
    "/dev/zero": (lambda p: p.symlink_to("/dev/zero"), "is not a regular file"),
    "invalid UTF-8": (lambda p: p.write_bytes(b"caf\xe9\n"), "line 1 is not UTF-8 text"),
}


def bad_documents(tmp_path: Path, hazard: str) -> tuple[Path, str, str]:
    """(the documents, where the error must point, what it must say) with `hazard` among good ones."""
    if hazard in BAD_LINES:
        line, says = BAD_LINES[hazard]
        path = tmp_path / "docs.jsonl"
        path.write_text("\n".join([*GOOD[:20], line, *GOOD[20:]]) + "\n", encoding="utf-8")
        return path, f"documents {path} line 21", says
    if hazard == "invalid UTF-8 line":
        path = tmp_path / "docs.jsonl"
        path.write_bytes(
            "\n".join(GOOD[:20]).encode() + b'\n{"text": "caf\xe9"}\n' + "\n".join(GOOD[20:]).encode()
        )
        return path, f"documents {path}", "line 21 is not UTF-8 text"
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, line in enumerate(GOOD):
        (folder / f"d{i:02d}.txt").write_text(json.loads(line)["text"], encoding="utf-8")
    make, says = BAD_FILES[hazard]
    make(folder / "d15b.txt")
    return folder, f"document {folder / 'd15b.txt'}", says


HAZARDS = [*BAD_LINES, "invalid UTF-8 line", *BAD_FILES]


@pytest.mark.slow
@pytest.mark.parametrize("hazard", HAZARDS)
def test_a_bad_document_met_while_the_tokenizer_trains_is_one_line_naming_its_file_and_line(tmp_path, hazard):
    """The trainer reads the documents through an iterator and would report what it raises as its own
    error (the staging tokenizer, a SWIG frame): the document's error comes back as it was raised."""
    docs, where, says = bad_documents(tmp_path, hazard)
    out = tmp_path / "data"
    result = cli(
        "data", "prepare", "--docs", str(docs), "--vocab-size", "300", "--val-docs", "5", "--out", str(out)
    )
    assert_one_line_error(result, f"error: {where}", says)
    assert ".staging" not in result.stderr and "INTERNAL" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == []  # nothing made, nothing left


@pytest.mark.parametrize("hazard", ["lone surrogate", "invalid UTF-8 line", "a FIFO"])
def test_a_bad_document_met_while_encoding_with_a_given_tokenizer_is_one_line(
    tmp_path, challenge_dir, hazard
):
    docs, where, says = bad_documents(tmp_path, hazard)
    result = cli("data", "prepare", "--docs", str(docs), "--tokenizer", str(challenge_dir / "fineweb_1024_bpe.model"),
                 "--val-docs", "5", "--out", str(tmp_path / "data"))  # fmt: skip
    assert_one_line_error(result, f"error: {where}", says)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signal_name", "status", "line"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_a_signal_while_the_tokenizer_trains_ends_the_command_with_its_status(
    tmp_path, signal_name, status, line
):
    """The signal arrives while the trainer reads the documents (its handler runs inside the trainer's
    iterator): the command ends as a signal ends it, and an existing dataset is left as it was."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    out = tmp_path / "data"
    args = ["data", "prepare", "--docs", str(docs), "--val-docs", "5", "--out", str(out), "--vocab-size"]
    assert cli(*args, "300").returncode == 0
    before = {
        p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".writer.pid"
    }
    stop = f"""
import os, signal
from core.datasets import prepare
texts = prepare.training_texts
def stopped(docs):
    for i, text in enumerate(texts(docs)):
        if i == 10:
            os.kill(os.getpid(), signal.{signal_name})
        yield text
prepare.training_texts = stopped
"""
    result = cli_after(stop, *args, "400")  # another vocabulary: another dataset
    assert result.returncode == status, result.stderr
    assert result.stderr.strip() == line
    after = {
        p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".writer.pid"
    }
    assert after == before
    assert not list(out.glob(".staging-*"))


# ----------------------------------------------------- the tokenizer trained on the first documents
@pytest.mark.slow
def test_the_exporters_tokenizer_trained_on_the_first_documents(golden, tmp_path):
    import hashlib

    limited, s = golden["train_docs"], golden["settings"]
    docs = write_train_docs_docs(tmp_path / "docs.jsonl")
    assert hashlib.sha256(docs.read_bytes()).hexdigest() == limited["docs_sha256"]
    prepare_docs(docs, tmp_path, "first", s["vocab_size"], s["val_docs"], s["shard_tokens"],
                 tokenizer_train_docs=limited["tokenizer_train_docs"])  # fmt: skip
    assert made(tmp_path, "first") == {"tokenizer": limited["tokenizer"], "shards": limited["shards"]}
    prepare_docs(docs, tmp_path, "all", s["vocab_size"], s["val_docs"], s["shard_tokens"])
    assert made(tmp_path, "all")["tokenizer"] == limited["tokenizer_on_all_docs"] != limited["tokenizer"]


def test_a_training_set_too_big_for_the_memory_is_refused_up_front(export_docs, tmp_path):
    size = export_docs.stat().st_size
    limit = training_memory(size // 2)  # room for about half of the documents
    with pytest.raises(
        PgolfError, match=r"fewer with --tokenizer-train-docs N \(about [\d,]+ fit\)$"
    ) as refused:
        prepare_docs(export_docs, tmp_path / "data", "m", 512, 200, 50_000, memory_limit=limit)
    total, message = count_documents(export_docs), str(refused.value)
    assert message.startswith(f"training the tokenizer on {total:,} documents ({size / 1e6:,.0f} MB) needs ")
    assert f"about {training_memory(size) / 1e6:,.0f} MB of memory" in message
    assert (
        f"1.4 bytes per byte of them, docs/tokenizers.md) and {limit / 1e6:,.0f} MB is available" in message
    )
    assert not (tmp_path / "data").exists()  # nothing read or written before the refusal
    fits = int(message.rsplit("about ", 1)[1].split()[0].replace(",", ""))
    assert total // 3 < fits < 2 * total // 3
    check_training_memory(fits, prepare._leading_bytes(export_docs, fits), limit)  # the advice fits
    with pytest.raises(PgolfError):
        check_training_memory(total, size, limit)
    assert (available_memory() or 0) > 0


@pytest.mark.slow
def test_tokenizer_train_docs_refusals(export_docs, tmp_path, challenge_dir):
    out = str(tmp_path / "data")
    refused = cli("data", "prepare", "--tokenizer-train-docs", "5", "--out", out)
    assert_one_line_error(refused, "--tokenizer-train-docs goes with --docs")
    assert refused.returncode == 2
    model = str(challenge_dir / "fineweb_1024_bpe.model")
    for flags in (["--tokenizer", model], []):
        refused = cli("data", "prepare", "--docs", str(export_docs), "--tokenizer-train-docs",
                      "0" if not flags else "5", *flags, "--out", out)  # fmt: skip
        assert_one_line_error(refused, "--tokenizer-train-docs", "at least 1", "not with --tokenizer")
    assert not (tmp_path / "data").exists()


def test_the_trainers_own_refusal_is_one_line_without_its_source_location(tmp_path):
    docs = tmp_path / "docs.jsonl"
    many = "".join(chr(0x4E00 + i) for i in range(400))  # more distinct characters than pieces
    docs.write_text("".join(json.dumps({"text": f"{many} {i}"}) + "\n" for i in range(10)), encoding="utf-8")
    args = ["--docs", str(docs), "--vocab-size", "300", "--val-docs", "2", "--out", str(tmp_path / "data")]
    result = cli("data", "prepare", *args)
    assert_one_line_error(result, "error: cannot train a 300-piece tokenizer", "Vocabulary size is smaller")
    assert "trainer_interface" not in result.stderr and ".staging" not in result.stderr
