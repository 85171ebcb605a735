"""Configs refused before any work: seeds outside what the frameworks take, a config file that never
ends, and one config check for every command (`config show` refuses what `train` refuses)."""

from __future__ import annotations

import pytest

from core.common.errors import PgolfError
from core.config.fields import SEED_MAX
from core.config.presets import preset
from core.config.sources import load_file, resolve
from tests.support.cli import assert_one_line_error, cli


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


# ------------------------------------------------- 4. nothing rounded, nothing ignored
@pytest.mark.parametrize(
    ("field", "text"), [("budget_bytes", "15999999.9999999999"), ("seed", "4294967295.00000001"),
                        ("iterations", "20.5"), ("seed", "nan"), ("seed", "1e99999")],
)  # fmt: skip
def test_a_fractional_integer_setting_is_refused_from_env_toml_json_and_flags(tmp_path, field, text):
    (tmp_path / "c.toml").write_text(f"{field} = {text}\n")
    (tmp_path / "c.json").write_text(f'{{"{field}": {text}}}')
    sources = [{"environ": {field.upper(): text}}, {"overrides": {field: text}}]
    if text not in ("nan", "1e99999"):  # not JSON's numbers; TOML spells them its own way
        sources += [{"file_path": tmp_path / name, "environ": {}} for name in ("c.toml", "c.json")]
    for source in sources:
        with pytest.raises(PgolfError, match=f"config: {field} expects int, got '?{text}'?"):
            resolve("smoke", **source)
    flag = cli("config", "show", "--preset", "smoke", f"--{field.replace('_', '-')}", text)
    assert_one_line_error(flag, f"'--{field.replace('_', '-')}'")


def test_whole_numbers_written_with_a_fraction_or_an_exponent_still_count(tmp_path):
    (tmp_path / "c.toml").write_text("iterations = 2e4\nbudget_bytes = 15000000.0\n")
    cfg = resolve("smoke", file_path=tmp_path / "c.toml", environ={"SEED": "7.000"})
    assert (cfg.iterations, cfg.budget_bytes, cfg.seed) == (20_000, 15_000_000, 7)


@pytest.mark.slow
def test_a_fit_margin_without_a_fit_or_a_fit_over_the_cap_is_refused_at_once(checkpoint):
    assert_one_line_error(
        cli("export", str(checkpoint), "--fit-margin", "1000"),
        "config: artifact_fit_margin=1000 needs artifact_fit_bytes (the cap it aims under)",
    )
    assert_one_line_error(
        cli("export", str(checkpoint), "--fit-bytes", "20000000"),
        "config: artifact_fit_bytes=20,000,000 is over budget_bytes=16,000,000",
    )
    assert_one_line_error(
        cli("config", "show", "--preset", "smoke", "--artifact-fit-bytes", "900", "--budget-bytes", "800"),
        "artifact_fit_bytes=900 is over budget_bytes=800",
    )


@pytest.mark.parametrize("margin", ["nan", "inf", "-inf"])
def test_a_margin_that_is_not_finite_is_refused(margin):
    assert_one_line_error(
        cli("config", "show", "--preset", "smoke", "--abort-margin", margin), "abort_margin must be finite"
    )
    assert_one_line_error(
        cli("runs", "--compare", "a", "--against", ".", "--margin", margin),
        "--margin",
    )
