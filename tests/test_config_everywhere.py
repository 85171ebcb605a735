"""Every config field checked the same way from every source in every command: `export` reads the
environment's artifact settings and refuses a bad value as `config show` does; an artifact whose kept
config is not a table is refused like one keeping a bad value."""

from __future__ import annotations

import pytest

from core.common.errors import PgolfError
from core.config.sources import resolve
from core.runs import setup
from tests.support.cli import assert_one_line_error, cli

BAD = [("abc", "expects int, got 'abc'"), ("-3", "must be >= 0, got -3"), ("1.5", "expects int, got '1.5'"),
       ("", "expects int, got ''")]  # fmt: skip


@pytest.mark.parametrize(("value", "refusal"), BAD)
def test_export_refuses_a_bad_variable_as_config_show_does(value, refusal, checkpoint, monkeypatch):
    """ATTN_PASSTHROUGH_NUMEL=abc (-3, 1.5, empty) was ignored by `export` with exit 0."""
    monkeypatch.setenv("ATTN_PASSTHROUGH_NUMEL", value)
    with pytest.raises(PgolfError) as shown:
        resolve("tiny").validate()  # what `config show` and every other command read
    with pytest.raises(PgolfError) as exported:
        setup.export_setup(checkpoint, None, "pgolf", {})
    named = " (env ATTN_PASSTHROUGH_NUMEL)" if "expects" in refusal else ""  # a wrong type: by its source
    assert str(exported.value) == str(shown.value) == f"config: attn_passthrough_numel {refusal}{named}"


def test_export_refuses_a_bad_variable_in_one_line(tmp_path):
    env = {"ATTN_PASSTHROUGH_NUMEL": "abc"}
    assert_one_line_error(
        cli("export", str(tmp_path / "step_000001.safetensors"), env=env),
        "error: config: attn_passthrough_numel expects int, got 'abc'",
    )


def test_export_applies_the_environments_artifact_settings_under_the_flags(checkpoint, monkeypatch):
    monkeypatch.setenv("ATTN_PASSTHROUGH_NUMEL", "7")
    assert setup.export_setup(checkpoint, None, "pgolf", {}).cfg.attn_passthrough_numel == 7
    assert (
        setup.export_setup(
            checkpoint, None, "pgolf", {"attn_passthrough_numel": 9}
        ).cfg.attn_passthrough_numel
        == 9
    )
    monkeypatch.setenv("MATRIX_LR", "abc")  # a training setting export does not apply: still checked
    with pytest.raises(PgolfError, match="config: matrix_lr expects float, got 'abc'"):
        setup.export_setup(checkpoint, None, "pgolf", {})


@pytest.mark.parametrize("kept", ["num_layers=2", ["num_layers", 2], 3])
def test_an_artifact_keeping_a_config_that_is_not_a_table_is_refused(tmp_path, kept):
    """It was scored silently with the default settings (4.4694 where its own give 4.0020)."""
    from core.artifact import container, int8_format
    from core.config.presets import preset
    from core.model.params import artifact_classes, init_params, storage_dtypes

    cfg = preset("smoke")
    model = int8_format.quantize_int8(init_params(cfg), storage_dtypes(cfg, False), artifact_classes(cfg))
    path = tmp_path / "a.pgolf"
    container.write_artifact(path, int8_format.artifact_bytes(model, "zlib", config=kept), "zlib")
    with pytest.raises(
        PgolfError, match=rf"artifact {path} keeps settings pgolf refuses: config: .* a table"
    ):
        setup.scoring_config(path, None, None, {})
