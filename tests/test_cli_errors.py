"""The reported commands end with one line (`error: ...`), through the command line."""

from __future__ import annotations

import pytest

from core.artifact import container, int8_format
from core.config.presets import preset
from core.model.params import init_params
from tests.support.cli import assert_one_line_error, cli, data_flags


# ------------------------------------------------- 1, 2 and 3 through the command line
@pytest.mark.slow  # ~4 s
def test_the_reported_commands_end_with_one_line(tmp_path):
    checks = [
        (["train", "--seed", "-1"], "seed must be in 0..4294967295"),
        (["train", "--model-dim", "1000000000"], "training needs about"),
        (["eval", "/dev/zero"], "not a regular file"),
    ]
    for args, fragment in checks:
        assert_one_line_error(cli(*args, "--backend", "cuda", "--data-path", str(tmp_path)), fragment)


@pytest.mark.slow  # ~5 s: a CLI eval
def test_an_artifact_without_a_checksum_is_scored_with_a_one_line_warning(sotu_dataset, tmp_path):
    blob = int8_format.artifact_bytes(int8_format.quantize_int8(init_params(preset("smoke"))))
    old = tmp_path / "old.pgolf"
    old.write_bytes(container.MAGIC_V1 + blob[len(container.MAGIC) : -container.DIGEST_BYTES])
    done = cli("eval", str(old), "--backend", "cuda", "--preset", "smoke", *data_flags(sotu_dataset))
    assert done.returncode == 0 and "val_bpb:" in done.stdout, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: {old} was written before pgolf's containers carried a checksum: damage to it cannot be "
        "detected (export it again to add one)"
    ]
