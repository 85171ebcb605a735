"""The tokenizer that made the data and the weights: the manifest and an artifact keep its SHA-256, and
another tokenizer is refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

from core.artifact.export import read_pgolf_artifact
from core.artifact.load import load_weights
from core.common.errors import PgolfError
from core.common.files import file_sha256
from core.data.manifest import check_tokenizer, read_manifest
from tests.support.artifacts import export_smoke
from tests.support.cli import assert_one_line_error, cli
from tests.support.data import CHALLENGE

OTHER_TOKENIZER = CHALLENGE / "fineweb_1024_bpe.model"  # vocab 1024 too, but not the one of sotu_sp1024


# ------------------------------------------------- the tokenizer that made the data, the weights
def test_the_manifest_records_the_tokenizer_of_each_dataset(sotu_dataset):
    (entry,) = read_manifest(sotu_dataset.root)["datasets"]
    assert entry["tokenizer_sha256"] == file_sha256(sotu_dataset.tokenizer_path)


def test_a_tokenizer_that_did_not_make_the_data_is_refused_by_name(sotu_dataset, tmp_path):
    cfg = sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER))
    with pytest.raises(
        PgolfError, match=r"tokenizer \S+fineweb_1024_bpe.model did not make dataset sotu_sp1024: "
    ):
        check_tokenizer(cfg.data_path, cfg.tokenizer_path)
    from core.runs.setup import training_runs

    flags = {"data_path": str(sotu_dataset.data_path), "tokenizer_path": str(OTHER_TOKENIZER)}
    with pytest.raises(PgolfError, match="did not make dataset sotu_sp1024"):  # train: before anything runs
        training_runs("cuda", "smoke", None, flags)
    copy = tmp_path / "copy.model"  # the same file elsewhere is the same tokenizer
    shutil.copy(sotu_dataset.tokenizer_path, copy)
    check_tokenizer(sotu_dataset.data_path, copy)
    # A manifest written before the hash was recorded: nothing to check against.
    old = tmp_path / "old"
    shutil.copytree(sotu_dataset.root, old)
    manifest = read_manifest(old)
    for entry in manifest["datasets"]:
        entry.pop("tokenizer_sha256")
    (old / "manifest.json").write_text(json.dumps(manifest))
    check_tokenizer(old / "datasets" / "sotu_sp1024", OTHER_TOKENIZER)


def test_an_artifact_keeps_its_tokenizer_and_refuses_another(sotu_dataset, tmp_path):
    path = tmp_path / "a.pgolf"
    export_smoke(path, tokenizer_path=str(sotu_dataset.tokenizer_path), quant_format="mixed")
    assert read_pgolf_artifact(path).tokenizer_sha256 == file_sha256(sotu_dataset.tokenizer_path)
    load_weights(path, sotu_dataset.config())
    with pytest.raises(
        PgolfError, match=rf"artifact {path} was trained with another tokenizer than \S+fineweb_1024"
    ):
        load_weights(path, sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER)))
    old = tmp_path / "old.pgolf"  # written before artifacts kept it: read as before
    export_smoke(old, tokenizer_path=str(tmp_path / "absent.model"))
    assert read_pgolf_artifact(old).tokenizer_sha256 is None
    load_weights(old, sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER)))


@pytest.mark.slow  # a CLI eval: ~5 s
def test_eval_with_the_wrong_tokenizer_is_one_line(sotu_dataset, tmp_path):
    path = tmp_path / "a.pgolf"
    export_smoke(path)
    result = cli("eval", str(path), "--backend", "cuda", "--preset", "smoke", "--data-path",
                 str(sotu_dataset.data_path), "--tokenizer-path", str(OTHER_TOKENIZER))  # fmt: skip
    assert_one_line_error(result, "did not make dataset sotu_sp1024")
