"""Shard checksums: recorded when a dataset is made, checked by `data verify`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.data.manifest import dataset_settings, file_sha256, read_manifest, verify_dataset
from core.datasets.embedded import prepare_sotu
from core.datasets.writers import write_shard
from tests.support.cli import assert_one_line_error, cli


@pytest.fixture
def small_data(tmp_path):
    prepare_sotu(tmp_path, vocab_size=1024, limit_docs=40)
    return tmp_path


def test_prepare_records_each_shards_sha256_and_verify_checks_them(small_data):
    entry = read_manifest(small_data)["datasets"][0]
    folder = small_data / entry["path"]
    assert entry["sha256"] == {p.name: file_sha256(p) for p in sorted(folder.glob("fineweb_*.bin"))}
    assert verify_dataset(small_data, "sotu_sp1024") == {
        "dataset": "sotu_sp1024", "shards": 2, "hashed": 2, "without_checksum": 0,
    }  # fmt: skip


def test_one_flipped_token_is_found(small_data):
    shard = next((small_data / "datasets" / "sotu_sp1024").glob("fineweb_train_*.bin"))
    blob = bytearray(shard.read_bytes())
    blob[4096] ^= 1  # a token past the header: size and header stay valid
    shard.write_bytes(bytes(blob))
    with pytest.raises(PgolfError, match=rf"shard {shard}: its SHA-256 differs"):
        verify_dataset(small_data, "sotu_sp1024")
    assert_one_line_error(cli("data", "verify", "--out", str(small_data)), "its SHA-256 differs")


def test_a_listed_shard_that_is_gone_or_a_manifest_without_checksums(small_data):
    manifest = small_data / "manifest.json"
    data = json.loads(manifest.read_text())
    data["datasets"][0]["sha256"]["fineweb_train_000009.bin"] = "0" * 64
    manifest.write_text(json.dumps(data))
    with pytest.raises(PgolfError, match="fineweb_train_000009.bin is listed but absent"):
        verify_dataset(small_data, "sotu_sp1024")
    del data["datasets"][0]["sha256"]  # written before checksums were recorded: headers only
    manifest.write_text(json.dumps(data))
    assert verify_dataset(small_data, "sotu_sp1024")["without_checksum"] == 2
    with pytest.raises(PgolfError, match="unknown dataset 'nope'"):
        verify_dataset(small_data, "nope")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hazard", "says"),
    [
        ("fifo", "is not a regular file"),
        ("[" * 200_000 + "]" * 200_000, "nested deeper than 64 levels"),
        ('{"datasets": [], "n": ' + "9" * 5000 + "}", "an integer of 5,000 digits"),
        ('{"datasets": [], "x": NaN}', "NaN is not a number JSON allows"),
    ],
)
def test_a_manifest_that_cannot_be_read_is_one_line_naming_it(tmp_path, hazard, says):
    manifest = tmp_path / "data" / "manifest.json"  # data/: where --dataset looks
    manifest.parent.mkdir()
    if hazard == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.write_text(hazard, encoding="utf-8")
    for args in (["data", "verify", "--bytes"], ["config", "show", "--dataset", "x"]):
        assert_one_line_error(cli(*args, cwd=tmp_path), f"manifest {Path('data', 'manifest.json')}", says)


# ------------------------------------------------- what data verify names, and the flags it refuses
def edit_entry(root: Path, change) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest["datasets"][0])
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_swapped_tokenizer_is_named_by_its_sha256_against_the_manifests(small_data, challenge_dir):
    model = small_data / "tokenizers" / "sotu_1024_bpe.model"
    recorded = read_manifest(small_data)["datasets"][0]["tokenizer_sha256"]
    shutil.copyfile(
        challenge_dir / "fineweb_1024_bpe.model", model
    )  # through the link: the dataset's own file
    for flags in ([], ["--bytes"]):
        result = cli("data", "verify", *flags, "--out", str(small_data))
        assert_one_line_error(result, f"tokenizer {model} did not make dataset sotu_sp1024", recorded[:12],
                              file_sha256(model)[:12])  # fmt: skip


def test_a_flipped_token_in_a_validation_shard_is_blamed_on_the_shard(small_data):
    shard = small_data / "datasets" / "sotu_sp1024" / "fineweb_val_000000.bin"
    blob = bytearray(shard.read_bytes())
    blob[2000] ^= 1
    shard.write_bytes(bytes(blob))
    assert_one_line_error(
        cli("data", "verify", "--bytes", "--out", str(small_data)), f"shard {shard}: its SHA-256 differs"
    )


@pytest.mark.slow
def test_validation_shards_without_tokens_are_one_line(small_data):
    shard = small_data / "datasets" / "sotu_sp1024" / "fineweb_val_000000.bin"
    write_shard(shard, np.zeros(0, np.uint16))
    edit_entry(small_data, lambda entry: entry["sha256"].update({shard.name: file_sha256(shard)}))
    for flags in ([], ["--bytes"]):
        assert_one_line_error(
            cli("data", "verify", *flags, "--out", str(small_data)), "its validation shards", "hold no tokens"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("docs", "says"),
    [
        (
            {"embedded": "sotu", "limit_docs": 40, "val_docs": "abc"},
            "val_docs must be a whole number of at least 1, not 'abc'",
        ),
        ({"embedded": "sotu", "limit_docs": 40, "val_docs": 1e300}, "val_docs must be a whole number"),
        ({"embedded": "sotu", "limit_docs": 40, "val_docs": 10**30}, "val_docs must be a whole number"),
        ({"path": 123, "sha256": None, "documents": 5, "val_docs": 2}, "path must be a file path, not '123'"),
        (
            {"path": "d.jsonl", "sha256": "zz", "documents": 5, "val_docs": 2},
            "sha256 must be a SHA-256 hex digest",
        ),
        ("docs.jsonl", "docs must be an object"),
        ("Infinity", "Infinity is not a number JSON allows"),
    ],
)
def test_a_manifest_docs_entry_that_is_not_one_is_one_line(small_data, docs, says):
    if docs == "Infinity":  # written as JSON would not write it
        text = (small_data / "manifest.json").read_text().replace('"val_docs": 4', '"val_docs": Infinity')
        (small_data / "manifest.json").write_text(text)
    else:
        edit_entry(small_data, lambda entry: entry.update(docs=docs))
    assert_one_line_error(
        cli("data", "verify", "--bytes", "--out", str(small_data)),
        f"manifest {small_data / 'manifest.json'}",
        says,
    )


@pytest.mark.slow
def test_verify_flags_that_would_be_ignored_or_cannot_be_counts_are_refused(small_data, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a"}\n')
    out = ["--out", str(small_data)]
    for flags, says in [
        (["--bytes", "--val-docs", "0"], "--val-docs must be at least 1, got 0"),
        (["--docs", str(docs), "--val-docs", "5"], "--docs goes with --bytes"),
        (["--val-docs", "5"], "--val-docs goes with --bytes"),
        (["--bytes", "--val-docs", "1e20"], "--val-docs"),
    ]:
        result = cli("data", "verify", *flags, *out)
        assert_one_line_error(result, says)
        assert result.returncode == 2  # a bad flag
    result = cli("data", "verify", "--bytes", "--docs", str(docs), "--val-docs", str(10**20), *out)
    assert_one_line_error(result, "--val-docs must be a whole number from 1 to")


@pytest.mark.slow
def test_prepare_refuses_an_empty_name_and_a_vocabulary_of_zero(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a"}\n{"text": "b"}\n')
    out = ["--out", str(tmp_path / "data")]
    assert_one_line_error(
        cli("data", "prepare", "--docs", str(docs), "--val-docs", "1", "--name", "", *out), "--name ''"
    )
    assert_one_line_error(
        cli("data", "prepare", "--vocab-size", "0", *out),
        "vocab_size must be in 2..65536 (uint16 shards), got 0",
    )
    assert not (tmp_path / "data" / "datasets").exists()


@pytest.mark.parametrize("vocab_size", [1024.5, "1024", True, 10**30])
def test_dataset_settings_refuse_a_vocab_size_that_is_not_a_whole_number_in_range(small_data, vocab_size):
    edit_entry(small_data, lambda entry: entry.update(vocab_size=vocab_size))
    with pytest.raises(PgolfError, match="lacks its vocab_size"):
        dataset_settings("sotu_sp1024", small_data)
