"""Divergence: the rules that stop a run whose loss the softcap hides, a run worse than uniform, and
weights that are not finite (never checkpointed, refused when resumed)."""

from __future__ import annotations

import numpy as np
import pytest

from core.artifact.checkpoint import save_checkpoint
from core.common.errors import PgolfError
from core.config.presets import preset
from core.train import loop
from core.train.loop import DIVERGENCE_AFTER_STEPS, WEIGHT_RMS_LIMIT, divergence
from tests.support.artifacts import make_checkpoint
from tests.support.backends import make_backend, needs
from tests.support.runs import train_quietly


# ------------------------------------------------- 7. divergence the softcap hides
def test_divergence_rules():
    cfg = preset("smoke")  # vocab 1024: uniform loss ln(1024) = 6.93
    calm = {"w": np.full(10, 0.03, np.float32)}
    after = DIVERGENCE_AFTER_STEPS
    assert divergence(cfg, after, 3.0, lambda: calm) is None
    assert divergence(cfg, after - 1, 7.5, lambda: calm) is None  # early steps may sit at ln(vocab)
    assert "above 6.9315" in divergence(cfg, after, 7.5, lambda: calm)
    assert "train_loss is nan" in divergence(cfg, 1, float("nan"), lambda: calm)
    exploded = {"w": np.full(10, 2 * WEIGHT_RMS_LIMIT, np.float32)}
    assert "the weights' RMS is 2e+03" in divergence(cfg, 1, 3.0, lambda: exploded)


@needs("cuda")
def test_a_huge_learning_rate_stops_the_run(sotu_dataset, tmp_path):
    """Muon at lr 1e6: the loss sits at ln(vocab) (the softcap keeps it finite) while the weights
    explode; the old check let the run train on and fail only when quantizing them."""
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=8, matrix_lr=1e6)
    backend = make_backend("cuda", cfg)
    try:
        with pytest.raises(
            PgolfError, match=r"training diverged: the weights' RMS is [\d.e+]+ .* at step 1;"
        ):
            loop.train(backend, log=lambda line: None)
    finally:
        backend.close()


# ------------------------------------------------- divergence the old rule let through
@pytest.mark.slow
@needs("cuda")
def test_a_run_worse_than_uniform_fails_by_name(sotu_dataset, tmp_path):
    """A huge embedding learning rate, 30 steps and no training log line: the weights stay small, and the
    run used to end "done" with a val_loss of 9.8, worse than predicting every token as equally likely."""
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=30, train_log_every=1000,
                              tied_embed_lr=10.0)  # fmt: skip
    with pytest.raises(PgolfError, match=r"training diverged: val_loss [\d.]+ at step 30 .* is 6\.9315\)"):
        train_quietly(cfg)
    assert not list((tmp_path / "r").glob("final_model.*"))
    assert "val" not in (tmp_path / "r" / "metrics.jsonl").read_text()  # no record of the diverged score


@needs("cuda")
def test_a_checkpoint_of_exploded_weights_is_refused_before_the_first_step(sotu_dataset, tmp_path):
    ckpt = make_checkpoint()
    ckpt.params = {k: np.full_like(v, 1e30) for k, v in ckpt.params.items()}  # finite, checksum valid
    ckpt.config = sotu_dataset.config(out_dir=str(tmp_path), iterations=6).to_dict()
    path = save_checkpoint(tmp_path / "exploded.safetensors", ckpt)
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=6)
    with pytest.raises(PgolfError, match=r"the weights' RMS is 1e\+30 .*resume from an earlier checkpoint"):
        train_quietly(cfg, resume=path)
    assert not (tmp_path / "r").exists()  # refused before the run directory


def test_no_checkpoint_is_written_of_non_finite_weights(tmp_path):
    assert loop.weights_rms({"a": np.array([3.0, 4.0]), "b": np.zeros(2)}) == pytest.approx(2.5)
    assert not loop.weights_rms({"a": np.array([np.nan])}) <= loop.WEIGHT_RMS_LIMIT
    assert not loop.weights_rms({"a": np.array([np.inf])}) <= loop.WEIGHT_RMS_LIMIT
