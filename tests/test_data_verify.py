"""Shard checksums: recorded when a dataset is made, checked by `data verify`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.data.manifest import file_sha256, read_manifest, verify_dataset
from core.datasets.embedded import prepare_sotu
from tests.helpers import assert_one_line_error, cli


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
