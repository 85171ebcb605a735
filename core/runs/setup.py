"""What a command needs before it runs: the configs of its runs, the weights it is given and the
config they are scored with, a checkpoint's export settings, the default data in place.

cli.py shows the results; nothing here prints. Each function refuses bad input with a PgolfError
before any work starts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.artifact.export import quant_label
from core.artifact.fit import fit_cap
from core.artifact.load import (
    SHAPE_FIELDS,
    artifact_compressor,
    checkpoint_config,
    is_checkpoint,
    load_checkpoint,
    load_weights,
    saved_config,
)
from core.common.compress import check_available
from core.common.errors import PgolfError
from core.common.launch import launch
from core.config.fields import Config, env_names, from_env
from core.config.presets import CHALLENGE_DATA_PRESETS, record_preset_of_env
from core.config.sources import (
    EXPORT_FIELDS,
    WRITING_FIELDS,
    apply_layer,
    load_file,
    resolve_sources,
    resumed_config,
)
from core.data.manifest import check_tokenizer, dataset_settings
from core.data.tokenizer import check_vocab, load_tokenizer
from core.eval.bpb import EvalData
from core.eval.score import load_eval_data
from core.model.backend import create, installed
from core.model.memory import check_config
from core.runs.summary import newest_checkpoint, run_of_checkpoint, weights_in

DEFAULT_DATA = Config().data_path
DEFAULT_DATA_ROOT = Path("data")  # where the default dataset is prepared on first use
DATA_WAIT_S = 1800.0  # how long torchrun's other ranks wait for local rank 0 to prepare the default data


# ------------------------------------------------------------------------ train
def training_runs(
    backend: str,
    preset: str,
    config: Path | None,
    overrides: dict[str, Any],
    resume: Path | None = None,
    seeds: str = "",
) -> tuple[list[Config], Path | None, list[str]]:
    """The runs `train` starts: their configs (one, or one per seed of `seeds`), each checked against
    the backend; the checkpoint the one run resumes from (a run directory means its newest); and
    the lines every run logs after its header (`train_notes`).

    With `resume`, the checkpoint's config is used, changed only where it may be (resumed_config),
    and the run goes on in the checkpoint's own directory unless --run-id or --out-dir names another.
    """
    cfg, sources = resolve_sources(preset, config, overrides)
    notes = train_notes(preset if resume is None else None, cfg, sources)
    if seeds:
        if resume is not None:
            raise PgolfError("--seeds starts new runs: it cannot go with --resume")
        configs = seed_configs(cfg, seeds)
    else:
        if resume is not None:
            resume = newest_checkpoint(resume)
            cfg = resumed_config(checkpoint_config(resume), cfg, sources)
            run = run_of_checkpoint(resume)
            if run is not None and sources["run_id"] == sources["out_dir"] == "default":
                cfg = cfg.replace(out_dir=str(run.parent), run_id=run.name)  # its own directory
        configs = [cfg]
    for run_cfg in configs:  # every run refused before the first one starts, and before any data is prepared
        check_config(backend, run_cfg)
        if run_cfg.artifact_fit_bytes:
            fit_cap(run_cfg)  # a margin that leaves no cap
        check_available(run_cfg.compressor)  # its artifact can be written after training
        check_tokenizer(run_cfg.data_path, run_cfg.tokenizer_path)  # the one that made the data
    return configs, resume, notes


def seed_configs(cfg: Config, seeds: str) -> list[Config]:
    """One config per seed of `--seeds`, in one group named by --run-group, else --run-id, else the time."""
    try:
        values = [int(part) for part in seeds.split(",") if part.strip()]
    except ValueError:
        raise PgolfError(f"--seeds must be comma-separated whole numbers, got {seeds!r}") from None
    if not values or len(set(values)) != len(values):
        raise PgolfError(f"--seeds must name distinct seeds, got {seeds!r}")
    group = cfg.run_group or cfg.run_id or time.strftime("%Y%m%d-%H%M%S")
    return [cfg.replace(seed=s, run_group=group, run_id=f"{group}-seed{s}").validate() for s in values]


def train_notes(preset: str | None, cfg: Config, sources: dict[str, str]) -> list[str]:
    """The lines a run logs after its header: the settings the environment gave, and a warning when a
    preset made for the challenge's data (`preset`, None on resume) trains on the embedded corpus."""
    notes = [f"from the environment: {name}={getattr(cfg, name)!r} ({source.removeprefix('env ')})"
             for name, source in sources.items() if source.startswith("env ")]  # fmt: skip
    if preset in CHALLENGE_DATA_PRESETS and cfg.data_path == DEFAULT_DATA:
        notes.append(
            f"warning: preset {preset} is made for the challenge's FineWeb data, but this run trains on the "
            "embedded State of the Union corpus (cli.py data download, then --dataset fineweb10B_sp1024)"
        )
    return notes


def default_data_to_prepare(cfg: Config) -> Path | None:
    """The folder this process must prepare the embedded corpus in before `cfg` can train on it:
    when the default dataset is asked for and is not there yet; else None.

    Under torchrun only local rank 0 prepares it; the other ranks of the machine wait here until
    its folder is in place (the last step of preparing it), or until torchrun stops them because
    rank 0 failed. Several machines sharing one disk would each prepare it: prepare it first.
    """
    if cfg.data_path != DEFAULT_DATA:
        return None
    data = Path(cfg.data_path)
    if launch().local_rank != 0:
        deadline = time.monotonic() + DATA_WAIT_S
        while not data.exists():
            if time.monotonic() > deadline:
                raise PgolfError(
                    f"local rank 0 has not prepared {data} in {DATA_WAIT_S:.0f} s: "
                    "run `cli.py data prepare` before torchrun"
                )
            time.sleep(0.5)
        return None
    return None if data.exists() else DEFAULT_DATA_ROOT


# ----------------------------------------------------------- eval, sample, verify
def scoring_config(
    path: Path, preset: str | None, config: Path | None, overrides: dict[str, Any] | None
) -> tuple[Path, Config]:
    """The weights a path means (a run directory: its artifact, else its newest checkpoint) and the
    config to use them with: the run's own when no preset is named (core.artifact.export.saved_config),
    with whatever a file, the environment or a flag gives on top; else the preset's. Weights that keep
    no settings (a record's artifact) given a record's logged environment start from that record's
    preset (core.config.presets.record_preset_of_env). How an artifact is written (quant_format, LQER,
    GPTQ, the compressor...) plays no part: its own format says how it is read."""
    return _scoring(path, preset, config, overrides)[:2]


def _scoring(
    path: Path, preset: str | None, config: Path | None, overrides: dict[str, Any] | None
) -> tuple[Path, Config, dict[str, tuple[Any, str]]]:
    """scoring_config, and what a file, the environment or a flag asked for: {field: (value, source)}."""
    inferred = None if preset else record_preset_of_env(os.environ)
    cfg, sources = resolve_sources(preset or inferred or "baseline", config, overrides or {})
    asked = {
        name: (getattr(cfg, name), source)
        for name, source in sources.items()
        if source.startswith(("env ", "file ", "flag", "dataset "))
    }
    cfg = cfg.replace(**{name: getattr(Config(), name) for name in WRITING_FIELDS})
    cfg.validate()  # a bad flag is refused before any file is read
    path = weights_in(path)
    saved = saved_config(path) if preset is None else None
    if saved is not None:
        found = saved[0]
        if "dataset" in found and "data_path" not in found:  # an artifact's own settings name the data
            with contextlib.suppress(PgolfError):  # not in data/manifest.json: the given paths stay
                found = dataset_settings(str(found["dataset"])) | found
        try:
            kept = Config.from_dict({**Config().to_dict(), **found}).validate()  # types, then ranges
            # what was asked for on top; a preset only guessed from the environment gives nothing
            given = {k: v for k, (v, _) in asked.items() if k not in WRITING_FIELDS}
            cfg = kept.replace(**given)
        except PgolfError as exc:  # a damaged or hand-made file's settings: name the file they came from
            raise PgolfError(f"{saved[1]} keeps settings pgolf refuses: {exc}") from None
    return path, cfg, asked


def _check_against_file(path: Path, cfg: Config, asked: dict[str, tuple[Any, str]]) -> None:
    """A setting asked for that the weights contradict (their shapes, a record artifact's compressor) is
    refused in one line naming both."""
    for name in SHAPE_FIELDS:
        if name in asked and asked[name][0] != getattr(cfg, name):
            value, source = asked[name]
            raise PgolfError(
                f"config: {name}={value!r} ({source}), but {path} holds weights with {name}={getattr(cfg, name)!r}"
            )
    if "compressor" in asked and not is_checkpoint(path):
        found = artifact_compressor(path)
        value, source = asked["compressor"]
        if found is not None and found != value:
            raise PgolfError(f"config: compressor={value!r} ({source}), but {path} is {found}-compressed")


def weights_and_data(
    path: Path, preset: str | None, config: Path | None, overrides: dict[str, Any] | None, allow_pickle: bool
) -> tuple[dict[str, np.ndarray], Config, EvalData]:
    """(weights, the one config they are scored with, validation data) for the eval and verify commands.

    Evaluation runs once: unless asked for, nothing is compiled.
    """
    path, cfg, asked = _scoring(path, preset, config, overrides)
    check_tokenizer(cfg.data_path, cfg.tokenizer_path)  # the one that made the data, as its manifest says
    params, cfg = load_weights(path, cfg, allow_pickle=allow_pickle)
    _check_against_file(path, cfg, asked)
    if cfg.compile == "auto":
        cfg = cfg.replace(compile="off")
    return params, cfg, load_eval_data(cfg)


def weights_and_tokenizer(
    path: Path, preset: str | None, config: Path | None, overrides: dict[str, Any] | None, allow_pickle: bool
) -> tuple[dict[str, np.ndarray], Config, Any]:
    """(weights, their config, the tokenizer checked against it) for the sample command; nothing compiled."""
    path, cfg, asked = _scoring(path, preset, config, overrides)
    params, cfg = load_weights(path, cfg.replace(compile="off"), allow_pickle=allow_pickle)
    _check_against_file(path, cfg, asked)
    sp = load_tokenizer(cfg.tokenizer_path)
    check_vocab(sp, cfg.vocab_size, cfg.tokenizer_path)
    return params, cfg, sp


def installed_backends() -> dict[str, Callable[[Config], Any]]:
    """A maker of each installed backend, by name: what verify scores an artifact with."""
    names = [info.name for info in installed()]
    if not names:
        raise PgolfError("no backend installed: pip install 'pgolf[torch]' or 'pgolf[mlx]'")
    return {name: functools.partial(create, name) for name in names}


# ----------------------------------------------------------------------- export


def check_writable(path: str | Path, what: str) -> Path:
    """Refuse, before any work, a file `write_atomic` could not write: a folder, or a file in a folder
    that is missing or takes no new file (no permission, read-only, /proc). Tried the way `write_atomic`
    writes: a temp file made beside it, then removed. `what` names the file (e.g. "--out")."""
    path = Path(path)
    if path.name in ("", ".", "..") or path.is_dir():
        raise PgolfError(f"{what} {path}: a folder, not a file")
    if not path.parent.is_dir():
        problem = "is a file, not a folder" if path.parent.exists() else "does not exist"
        raise PgolfError(f"{what} {path}: cannot write there: {path.parent} {problem}")
    try:
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.pgolf-{os.getpid()}-", suffix=".tmp"
        )
    except OSError as exc:
        raise PgolfError(f"{what} {path}: cannot write in {path.parent} ({exc.strerror or exc})") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class Export:
    """What `export` writes: the weights of a checkpoint, their config and where they go."""

    params: dict[str, np.ndarray]  # the moving average of the weights when the run kept one
    dtypes: dict[str, str]
    cfg: Config  # the checkpoint's, with the artifact settings given
    target: Path
    upstream: bool  # the challenge's torch.save + zlib file rather than pgolf's container


def export_setup(
    checkpoint: Path,
    out: Path | None,
    format: str,
    overrides: dict[str, Any] | None,
    config: Path | None = None,
) -> Export:
    """The export of `checkpoint` in `format` (pgolf or upstream) to `out` (default: beside the
    checkpoint), with only the EXPORT_FIELDS of the checkpoint's config changed by `overrides`, and
    under them by those of the `config` file (its other fields are the checkpoint's own: a fitted
    config, `.fit.toml`, names them all)."""
    if out is not None:  # refused now, not after a fit of minutes
        check_writable(out, "--out")
    given = load_file(config) if config is not None else {}
    env, env_vars = from_env(), env_names()
    # every value checked as every command checks it (a wrong type named by its source), those export ignores too
    for layer in ({k: (v, f"file {config}") for k, v in given.items()},
                  {k: (v, f"env {env_vars[k]}") for k, v in env.items()}):  # fmt: skip
        apply_layer(Config(), layer).check_fields(layer)
    # the checkpoint's config, under a file's, the environment's, then the flags' artifact settings
    overrides = {k: v for k, v in (given | env).items() if k in EXPORT_FIELDS} | dict(overrides or {})
    if format not in ("pgolf", "upstream"):
        raise PgolfError(f"unknown export format {format!r} (choose pgolf or upstream)")
    fixed = sorted(set(overrides) - set(EXPORT_FIELDS))
    if fixed:
        raise PgolfError(
            f"export keeps the checkpoint's config; --{fixed[0].replace('_', '-')} cannot change "
            f"(only the artifact, data and execution settings: {', '.join(EXPORT_FIELDS)})"
        )
    ckpt = load_checkpoint(checkpoint)
    cfg = Config.from_dict(ckpt.config).replace(**overrides).validate()
    if cfg.artifact_fit_bytes:
        fit_cap(cfg)  # refused now, not after GPTQ's calibration
    upstream = format == "upstream"
    if not upstream:
        check_available(cfg.compressor)
    if upstream and (cfg.quant_format != "int8" or cfg.compressor != "zlib" or cfg.byte_shuffle):
        raise PgolfError(
            "the upstream format is int8 + zlib only: drop the artifact flags, or use --format pgolf"
        )
    suffix = ".int8.ptz" if upstream else f".{quant_label(cfg)}.pgolf"
    target = out or checkpoint.with_suffix(suffix)
    if target.resolve() == checkpoint.resolve():
        raise PgolfError(f"--out {target} is the checkpoint itself: choose another file")
    check_writable(target, "--out" if out is not None else "the artifact (beside the checkpoint)")
    params = ckpt.params
    if cfg.ema_decay > 0:
        params = {name: ckpt.optimizer[f"ema/{name}"] for name in params}
    return Export(params, ckpt.dtypes, cfg, target, upstream)
