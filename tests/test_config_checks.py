"""Configs refused before any work: seeds outside what the frameworks take, a config file that never
ends, and one config check for every command (`config show` refuses what `train` refuses)."""

from __future__ import annotations

import pytest

from core.common.errors import PgolfError
from core.config.fields import SEED_MAX
from core.config.presets import preset
from core.config.sources import load_file, resolve
from tests.helpers import (
    assert_one_line_error,
    cli,
)


# ------------------------------------------------- 1. seeds outside what the frameworks take
@pytest.mark.parametrize("seed", ["-1", str(2**64 + 1), str(SEED_MAX + 1)])
def test_seeds_out_of_range_are_refused_from_flags_env_and_toml(tmp_path, seed):
    toml = tmp_path / "c.toml"
    toml.write_text(f"seed = {seed}\n")
    for cfg in (
        resolve("smoke", overrides={"seed": seed}),
        resolve("smoke", environ={"SEED": seed}),
        resolve("smoke", file_path=toml, environ={}),
    ):
        with pytest.raises(PgolfError, match=f"seed must be in 0..{SEED_MAX}"):
            cfg.validate()
    assert load_file(toml)["seed"] == int(seed)


def test_a_config_file_that_never_ends_is_refused(tmp_path):
    with pytest.raises(PgolfError, match="cannot read /dev/zero: not a regular file"):
        load_file("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 2**20)
    with pytest.raises(PgolfError, match="big.toml holds more than 1,048,576 bytes: not a config file"):
        load_file(big)


def test_the_ends_of_the_seed_range_are_accepted():
    for seed in (0, SEED_MAX):
        assert preset("smoke").replace(seed=seed).validate().seed == seed


# ------------------------------------------------- one config check for every command
@pytest.mark.parametrize("rank", ["100000", "0"])
def test_config_show_refuses_what_train_refuses(rank):
    assert_one_line_error(
        cli("config", "show", "--preset", "smoke", "--ttt-lora-rank", rank), "ttt_lora_rank must be"
    )
