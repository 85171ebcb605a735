"""`data prepare --docs`: the challenge exporter's tokenizer and shards from the same documents (its golden,
tests/golden/make_challenge_export.py), documents read from JSON lines or .txt files, clear refusals, and
a stopped prepare that leaves the data folder as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.data.manifest import read_manifest
from core.datasets import prepare
from core.datasets.prepare import count_documents, prepare_docs, read_documents
from tests.golden_data import CHALLENGE_EXPORT, shard_sha256, tokenizer_digest, write_export_docs
from tests.helpers import assert_one_line_error, cli


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
