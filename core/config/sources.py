"""Where a config's values come from, layered: preset < config file (TOML or JSON) < environment < flags.

Field names are the upstream scripts' hyperparameter names in lower case, so the upstream
environment variables (`ITERATIONS`, `MATRIX_LR`, ...) map onto them by upper-casing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError, did_you_mean
from core.common.files import parse_json, parse_toml, read_json, read_text
from core.config.fields import Config, env_names, field_names, from_env
from core.config.presets import preset_values
from core.data.manifest import dataset_settings

# Where each field belongs (its declaration's `section`): what the lists below are drawn from.
SECTIONS = ("data", "run", "schedule", "eval", "model", "optimizer", "artifact", "execution")


def _names(keep: Callable[[dict], bool]) -> tuple[str, ...]:
    """The fields whose declaration (core/config/fields.py) `keep` accepts."""
    return tuple(f.name for f in fields(Config) if keep(f.metadata))


# What a resumed run may set differently from its checkpoint: how long, how often it reports and
# checkpoints, and how it executes; not what it computes.
RESUMABLE_FIELDS = _names(lambda m: m["resume"])
# How an artifact is written: nothing a reader of it needs (its own format says how it is read).
WRITING_FIELDS = _names(lambda m: m["section"] == "artifact" and not m["scoring"])
# What `export` may change: how the artifact is written, where GPTQ's calibration data is and how it
# runs; never what the artifact is scored with.
EXPORT_FIELDS = _names(lambda m: m["section"] in ("artifact", "data", "execution") and not m["scoring"])

# Upstream spellings that are not simply FIELD.upper().
MAX_CONFIG_BYTES = 2**20  # a TOML file of every field is a few KB


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a flat table of config fields: TOML, or JSON when the name ends in .json (a run's
    config.json). Unknown keys, a key given twice, and a value that is a table or a list are errors.

    Regular files only, up to MAX_CONFIG_BYTES: a FIFO (`--config <(...)` too), a device or a
    folder is refused before anything is read."""
    p = Path(path)
    as_json = p.suffix.lower() == ".json"
    try:
        info = os.stat(p)
    except FileNotFoundError:
        raise PgolfError(f"config: file not found: {p}") from None
    except OSError as exc:
        raise PgolfError(f"config: cannot read {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise PgolfError(f"config: cannot read {p}: not a regular file (a folder, a FIFO or a device)")
    if info.st_size > MAX_CONFIG_BYTES:
        raise PgolfError(f"config: {p} holds more than {MAX_CONFIG_BYTES:,} bytes: not a config file")

    # Numbers with a fraction are read exactly (Decimal): an integer field refuses 15999999.9999999999,
    # which a float would have rounded to 16000000 (core/config/fields.py's _coerce).
    text = read_text(p, "config", MAX_CONFIG_BYTES)
    if as_json:
        data = parse_json(text, f"config: {p}", exact=True, unique_keys=True)
    else:
        data = parse_toml(text, f"config: {p}", exact=True)
    if not isinstance(data, dict):
        raise PgolfError(f"config: {p} must hold one object of config fields")
    unknown = sorted(set(data) - field_names())
    if unknown:
        raise PgolfError(
            f"config: unknown key {unknown[0]!r} in {p}{did_you_mean(unknown[0], field_names())}"
        )
    for key, value in data.items():
        if value is None:
            raise PgolfError(f"config: {key} in {p} has no value (null)")
        if isinstance(value, dict | list):
            raise PgolfError(f"config: {key} in {p} must be one value, not a table or a list")
    return data


def read_run_config(path: str | Path) -> dict[str, Any]:
    """A run's config.json (`path`: the file) as written: one JSON object, read through the guarded reader
    (a regular file of at most MAX_CONFIG_BYTES, UTF-8, JSON bounded); else a PgolfError naming it."""
    data = read_json(path, "run config", MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise PgolfError(f"run config {path} must hold one object of config fields")
    return data


DEFAULT_SOURCE = "default"


def resolve_sources(
    preset_name: str = "baseline",
    file_path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> tuple[Config, dict[str, str]]:
    """The config of preset, then file, then upstream env vars, then explicit overrides (flags), and
    where each field's value came from: 'default', 'preset P', 'file F', 'env VAR', 'flag', or
    'dataset D' for the paths a `dataset` looked up in the manifest.

    A layer that names a dataset sets data_path, tokenizer_path, vocab_size and caseops_enabled from
    the manifest, except those the same layer sets itself (a run's config.json holds them all).
    """
    env_vars = env_names(environ)
    layers = [
        {k: (v, f"preset {preset_name}") for k, v in preset_values(preset_name).items()},
        {k: (v, f"file {file_path}") for k, v in load_file(file_path).items()} if file_path else {},
        {k: (v, f"env {env_vars[k]}") for k, v in from_env(environ).items()},
        {k: (v, "flag") for k, v in (overrides or {}).items()},
    ]
    cfg, sources = Config(), dict.fromkeys(field_names(), DEFAULT_SOURCE)
    for layer in layers:
        name = layer.get("dataset", ("", ""))[0]
        if name and not {"data_path", "tokenizer_path", "vocab_size"} <= set(layer):
            found = dataset_settings(str(name))
            layer = {**{k: (v, f"dataset {name}") for k, v in found.items()}, **layer}
        cfg = apply_layer(cfg, layer)
        sources.update({k: source for k, (_, source) in layer.items()})
    if not cfg.dataset:
        cfg = cfg.replace(dataset=Path(cfg.data_path).name)
        sources["dataset"] = "data_path"
    return cfg, sources


def apply_layer(cfg: Config, layer: dict[str, tuple[Any, str]]) -> Config:
    """`cfg` with a layer's values, {field: (value, where it came from)}; a value of the wrong type is
    refused naming where it came from (`file F`, `env VAR`, `flag`)."""
    try:
        return cfg.replace(**{k: value for k, (value, _) in layer.items()})
    except PgolfError as exc:
        for name, (value, source) in layer.items():  # which value: the error of the first that fails alone
            try:
                cfg.replace(**{name: value})
            except PgolfError:
                raise PgolfError(f"{exc} ({source})") from None
        raise


def resolve(
    preset_name: str = "baseline",
    file_path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Preset, then config file, then upstream env vars, then explicit overrides (flags)."""
    return resolve_sources(preset_name, file_path, overrides, environ)[0]


def given_values(cfg: Config, sources: dict[str, str]) -> dict[str, Any]:
    """The fields of `cfg` that were asked for (by a preset, a file, the environment or a flag)."""
    return {
        name: getattr(cfg, name)
        for name, source in sources.items()
        if source not in (DEFAULT_SOURCE, "data_path")
    }


def resumed_config(saved: dict[str, Any], cfg: Config, sources: dict[str, str]) -> Config:
    """The config a checkpoint was trained with, plus what was given now (by a preset named on the
    command line, a file, the environment or a flag) of RESUMABLE_FIELDS; anything else that differs
    from the checkpoint is refused by name."""
    base = Config.from_dict(saved)
    changes, refused = {}, []
    for name, value in given_values(cfg, sources).items():
        old = getattr(base, name)
        if value == old:
            continue
        if name in RESUMABLE_FIELDS:
            changes[name] = value
        else:
            refused.append(f"{name} (the checkpoint has {old!r}, {sources[name]} gives {value!r})")
    if refused:
        raise PgolfError(
            f"config: cannot change when resuming: {', '.join(refused)}; only {', '.join(RESUMABLE_FIELDS)} can"
        )
    resumed = base.replace(**changes)
    return resumed if resumed.dataset else resumed.replace(dataset=Path(resumed.data_path).name)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ['matrix_lr=0.02', 'iterations=100'] into a dict, checking each key."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_").lower()
        if not sep:
            raise PgolfError(f"config: override {pair!r} must look like key=value")
        if key not in field_names():
            raise PgolfError(f"config: unknown key {key!r}")
        out[key] = value
    return out
