"""The artifact fit (core/artifact/fit.py) scored with a backend: its calibration tokens and loss, and
the search run on one model, as `export --fit-bytes` and `train` with `artifact_fit_bytes` run it.

Calibration tokens are the last `artifact_fit_tokens` of the training stream (its last shards): data
the challenge allows before scoring, and which a run that did not go through all its training tokens
never trained on. Validation tokens are never read here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.artifact.fit import FIT_FIELDS, Fit, fit_artifact, fit_cap
from core.common.errors import PgolfError
from core.common.files import write_atomic
from core.config.fields import Config
from core.data.shards import find_shards, read_shard, read_shard_header
from core.train.loop import RANK_0_WAIT_SECONDS

if TYPE_CHECKING:
    from core.model.backend import Backend
    from core.train.loop import Training

__all__ = [
    "calibration_loss",
    "calibration_tokens",
    "fit_in_run",
    "fit_on_backend",
    "fit_shards",
    "shared_fit",
    "write_fit",
    "write_fit_in_run",
]

BATCH_SEQS = 8  # sequences per eval_nll call
FIT_KEY = "pgolf/artifact_fit"  # what rank 0 chose, or why it failed, for the other ranks


def _wanted_tokens(cfg: Config) -> int:
    return max(cfg.artifact_fit_tokens // cfg.train_seq_len, 1) * cfg.train_seq_len + 1


def fit_shards(cfg: Config) -> list[Path]:
    """The training shards the fit's calibration tokens come from: the last ones, as many as they take."""
    shards, have = [], 0
    for path in reversed(find_shards(cfg.data_path, "train")):
        shards.insert(0, path)
        have += read_shard_header(path)
        if have >= _wanted_tokens(cfg):
            break
    return shards


def calibration_tokens(cfg: Config) -> np.ndarray:
    """The last tokens of the training shards (`fit_shards`): whole sequences of `train_seq_len`, at
    most `artifact_fit_tokens` targets, plus the token before the first target."""
    seq = cfg.train_seq_len
    want = _wanted_tokens(cfg)
    parts = [read_shard(path, cfg.vocab_size) for path in fit_shards(cfg)]
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    usable = (min(tokens.size, want) - 1) // seq * seq
    if usable <= 0:
        raise PgolfError(
            f"the artifact fit needs {seq + 1} training tokens in {cfg.data_path}, found {tokens.size}"
        )
    return tokens[tokens.size - usable - 1 :].astype(np.int32)


def calibration_loss(backend: Backend, tokens: np.ndarray) -> Callable[[dict[str, np.ndarray]], float]:
    """weights -> their mean cross-entropy (nats per token) on `tokens`, in sequences of `train_seq_len`,
    scored by `backend` (which the weights are loaded into)."""
    seq = backend.cfg.train_seq_len
    x, y = tokens[:-1].reshape(-1, seq), tokens[1:].reshape(-1, seq)

    def loss(weights: dict[str, np.ndarray]) -> float:
        backend.load_params(weights)
        total = 0.0
        for i in range(0, len(x), BATCH_SEQS):
            total = total + backend.eval_nll(x[i : i + BATCH_SEQS], y[i : i + BATCH_SEQS])
        return float(total) / x.size

    return loss


def fit_on_backend(
    backend: Backend,
    params: dict[str, np.ndarray],
    cfg: Config,
    dtypes: dict[str, str],
    cap: int,
    code_bytes: Callable[[Config], int],
    hessians: dict[str, np.ndarray] | None,
    log: Callable[[str], None] | None = None,
) -> Fit:
    """The fit of `params` under `cap` bytes, scored on the calibration tokens by `backend` (which is
    left holding some candidate's weights)."""
    loss = calibration_loss(backend, calibration_tokens(cfg))
    return fit_artifact(params, cfg, dtypes, cap, loss, code_bytes, hessians, log)


def fit_in_run(
    training: Training, params: dict[str, np.ndarray], hessians: dict[str, np.ndarray] | None
) -> tuple[Config, Fit | None]:
    """A training run's fit (`artifact_fit_bytes`) of its final weights, run on rank 0 and shared
    (`shared_fit`): the run's config with the chosen settings, and on rank 0 the Fit."""
    backend, cfg, code_bytes = training.backend, training.cfg, training.code_bytes
    measure = code_bytes if callable(code_bytes) else lambda _: int(code_bytes or 0)
    cap = fit_cap(cfg)
    return shared_fit(
        backend,
        cfg,
        lambda: fit_on_backend(backend, params, cfg, training.dtypes, cap, measure, hessians, training.say),
    )


def write_fit_in_run(fit: Fit, artifact: Path, log: Callable[[str], None]) -> list[Path]:
    """A training run's fit files beside its artifact (`write_fit`), each logged; return the shards
    its calibration tokens came from (`fit_shards`), which the run's calibration record names."""
    for path in write_fit(fit, artifact):
        log(f"fit:wrote {path}")
    return fit_shards(fit.cfg)


def toml_text(cfg: Config) -> str:
    """`cfg` as a flat TOML table (a --config file)."""
    lines = []
    for name, value in cfg.to_dict().items():
        lines.append(f"{name} = {str(value).lower() if isinstance(value, bool) else json.dumps(value)}")
    return "\n".join(lines) + "\n"


def fit_files(artifact: Path) -> tuple[Path, Path]:
    """Where a fit's files go, beside its artifact: `<artifact>.fit.json` and `<artifact>.fit.toml`."""
    return artifact.with_name(artifact.name + ".fit.json"), artifact.with_name(artifact.name + ".fit.toml")


def write_fit(fit: Fit, artifact: Path) -> tuple[Path, Path]:
    """Beside the artifact (`fit_files`): the candidates tried as JSON, and the chosen settings as a
    config (the whole config, no run id, the fit off) that `train --config` or `export --config`
    reproduces the artifact with."""
    table, config = fit_files(artifact)
    write_atomic(table, (json.dumps(fit.to_json(), indent=1) + "\n").encode())
    write_atomic(config, toml_text(fit.cfg.replace(run_id="")).encode())
    return table, config


def shared_fit(backend: Backend, cfg: Config, fit: Callable[[], Fit]) -> tuple[Config, Fit | None]:
    """Rank 0 runs `fit`; every rank returns `cfg` with the settings it chose (rank 0 also the Fit).

    The other ranks wait for rank 0 in `backend.from_rank_0` (PyTorch: the process group's store), not
    in a collective, whose timeout a fit of many minutes would outlast. When the fit fails on rank 0,
    it says so to them first, and they end with one line too.
    """
    if backend.rank != 0:
        message = json.loads(backend.from_rank_0(FIT_KEY, None, RANK_0_WAIT_SECONDS))
        if "error" in message:
            raise PgolfError(f"rank 0's artifact fit failed: {message['error']}")
        return cfg.replace(**message["settings"], artifact_fit_bytes=0), None
    try:
        done = fit()
    except BaseException as exc:
        if backend.world_size > 1:
            reason = str(exc) if isinstance(exc, PgolfError) else f"{type(exc).__name__}: {exc}"
            backend.close(failed=True)  # rank 0 is the job's first failure before the others hear of it
            with contextlib.suppress(Exception):  # the failure being reported matters more than this one
                backend.from_rank_0(FIT_KEY, json.dumps({"error": reason.split("\n")[0]}), 0)
        raise
    settings = {name: getattr(done.cfg, name) for name in FIT_FIELDS}
    backend.from_rank_0(FIT_KEY, json.dumps({"settings": settings}), 0)
    return done.cfg, done
