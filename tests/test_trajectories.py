"""Training trajectories: pgolf's whole training loop against the challenge scripts' own loops.

Each golden in tests/golden/ was written by the make_trajectory_*.py script beside it, which imports
the script and runs its own training on a CPU in float32 from its own initial weights (stored beside the
golden, what `train --init-from` reads) and its own batches (from a token stream stored in the golden,
written here as a shard that pgolf's loader reads). pgolf runs `train` with the script's environment
(`from_env`, the mapping a user's environment gets) at compute_dtype=float32, and must give each step's
training loss within 1e-4 and final weights within 1e-4 relative (per tensor, ||pgolf - script|| / ||script||).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.config.fields import from_env
from core.config.presets import preset
from core.runs.summary import read_metrics
from core.train.loop import train
from tests.golden.make_trajectory_baseline import write_shard
from tests.test_backends import BACKENDS, make_backend
from tests.test_golden_records import read_golden
from tests.test_training import final_params

GOLDEN = Path(__file__).resolve().parent / "golden"
LOSS_TOL = 1e-4
WEIGHT_RTOL = 1e-4


def trajectory(name: str, preset_name: str, dataset, backend_name: str, tmp_path: Path):
    """(per-step losses, final weights) of pgolf's run, and the same from the golden."""
    meta, golden = read_golden(GOLDEN / f"trajectory_{name}.safetensors", "")
    data = tmp_path / "data"
    data.mkdir()
    tokens = golden["train_tokens"]
    write_shard(data / "fineweb_train_000000.bin", tokens)
    write_shard(data / "fineweb_val_000000.bin", tokens[: 2048 + 1])
    env = json.loads(meta["env"])
    pgolf_only = dict(
        data_path=str(data), tokenizer_path=str(dataset.tokenizer_path), out_dir=str(tmp_path), run_id="run",
        init_from=str(GOLDEN / f"trajectory_{name}_init.safetensors"), compute_dtype="float32", compile="off",
        train_log_every=1, val_loss_every=0, val_batch_size=2048, val_max_tokens=2048,
    )  # fmt: skip
    cfg = preset(preset_name).replace(**from_env(env)).replace(**pgolf_only).validate()
    backend = make_backend(backend_name, cfg)
    try:
        result = train(backend, log=lambda line: None)
    finally:
        backend.close()
    losses = [r["train_loss"] for r in read_metrics(result.run_dir) if r["kind"] == "train"]
    final = {k.removeprefix("final/"): v for k, v in golden.items() if k.startswith("final/")}
    return np.array(losses), final_params(result), golden["train_loss"], final


def largest_differences(losses, params, golden_losses, golden_params) -> tuple[float, float, str]:
    """The largest per-step loss difference, and the largest relative weight difference with its tensor."""
    assert losses.shape == golden_losses.shape
    assert params.keys() == golden_params.keys()
    loss_diff = float(np.max(np.abs(losses - golden_losses)))
    rel = {
        name: float(
            np.linalg.norm(params[name] - w.reshape(params[name].shape)) / max(np.linalg.norm(w), 1e-30)
        )
        for name, w in golden_params.items()
    }
    worst = max(rel, key=rel.get)
    return loss_diff, rel[worst], worst


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_baseline_trajectory(sotu_dataset, backend_name, tmp_path):
    """The challenge's baseline train_gpt.py, 30 steps: warm-down by steps, Muon momentum warm-up, grad
    clip, tied embeddings, 8 micro-batches a step from its sequential token stream."""
    got = trajectory("baseline", "baseline", sotu_dataset, backend_name, tmp_path)
    loss_diff, weight_diff, worst = largest_differences(*got)
    print(f"baseline {backend_name}: loss {loss_diff:.3g}, weights {weight_diff:.3g} ({worst})")
    assert loss_diff <= LOSS_TOL, loss_diff
    assert weight_diff <= WEIGHT_RTOL, (worst, weight_diff)
