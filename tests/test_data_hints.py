"""A missing dataset or tokenizer names the command that makes it (core/data/shards.py `making_command`)."""

from __future__ import annotations

import pytest

from core.common.errors import PgolfError
from core.data.shards import find_shards, making_command
from core.data.tokenizer import load_tokenizer
from tests.support.cli import assert_one_line_error, cli


@pytest.mark.parametrize(
    ("path", "command"),
    [
        ("data/datasets/sotu_sp1024", "python cli.py data prepare"),
        ("data/tokenizers/sotu_1024_bpe.model", "python cli.py data prepare"),
        ("data/datasets/sotu_sp4096", "python cli.py data prepare --vocab-size 4096"),
        ("data/datasets/sotu_sp1024_caseops", "python cli.py data prepare --caseops"),
        ("data/tokenizers/sotu_1024_bpe_caseops.model", "python cli.py data prepare --caseops"),
        ("data/datasets/sotu_sp2048_caseops", "python cli.py data prepare --caseops --vocab-size 2048"),
        ("data/datasets/fineweb10B_sp1024", "python cli.py data download --variant sp1024"),
        ("data/tokenizers/fineweb_4096_bpe.model", "python cli.py data download --variant sp4096"),
        ("data/datasets/mybooks_sp1024", "python cli.py data prepare --docs FILE --name mybooks_sp1024"),
        (
            "data/tokenizers/mybooks_sp1024.model",
            "python cli.py data prepare --docs FILE --name mybooks_sp1024",
        ),
    ],
)
def test_the_hint_names_the_command_that_makes_that_data(path, command):
    assert making_command(path).split(",")[0] == command


def test_missing_data_and_tokenizer_say_how_to_make_them(tmp_path):
    with pytest.raises(PgolfError, match=r"does not exist \(run: python cli.py data prepare --caseops\)"):
        find_shards(tmp_path / "sotu_sp1024_caseops", "val")
    with pytest.raises(
        PgolfError, match=r"does not exist \(run: python cli.py data download --variant sp1024\)"
    ):
        load_tokenizer(tmp_path / "fineweb_1024_bpe.model")


def test_a_record_0427_tiny_run_without_caseops_data_names_caseops(tmp_path):
    """It said "run: python cli.py data prepare", which makes the data without CaseOps."""
    result = cli("train", "--preset", "record_0427_tiny", cwd=tmp_path)
    assert_one_line_error(result, "does not exist (run: python cli.py data prepare --caseops)")
