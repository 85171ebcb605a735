"""The contract between the backends: what one writes, the other reads and scores the same.

Tolerances (fp32 on a CPU, smoke model):
- forward: logits within 2e-5 absolute, mean loss within 1e-5 relative (fp32 round-off);
- one artifact scored by both: val_bpb within 1e-5 (the `verify` tolerance);
- artifacts exported from the same weights: byte-identical (quantization is in core);
- a resumed step in the other backend, and curves of 8 steps from the same seed: parameters
  within 1e-4 and losses within 1e-4 relative. Each framework sums in its own order (~1e-7
  relative per op); Newton-Schulz and Adam's first steps amplify that, never beyond ~1e-5 here.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.artifact import int8_format, upstream
from core.artifact.export import export_artifact
from core.artifact.load import load_checkpoint, read_artifact
from core.eval.plain import evaluate
from core.eval.score import load_eval_data
from core.model.params import init_params, storage_dtypes
from core.runs.summary import read_metrics
from tests.support.artifacts import NEEDS_LRZIP
from tests.support.backends import LOOPS_LANES, MODEL_SWITCHES, NEEDS, batch, busy_params, make_backend
from tests.support.runs import final_params, run

pytestmark = [*NEEDS["cuda"], *NEEDS["mlx"]]
DIRECTIONS = [("cuda", "mlx"), ("mlx", "cuda")]
# The baseline, and every model and optimizer feature on (weight decay, the weights' moving average).
MODELS = {
    "baseline": {},
    "features": {
        **MODEL_SWITCHES,
        "num_layers": 3,
        "muon_wd": 0.05,
        "embed_wd": 0.05,
        "adam_wd": 0.02,
        "ema_decay": 0.9,
        "wd_taper_start_frac": 0.5,
        "wd_taper_final_mult": 0.5,
    },
}


@pytest.mark.parametrize("model", MODELS)
def test_same_seed_same_initial_weights(sotu_dataset, model):
    cfg = sotu_dataset.config(**MODELS[model])
    weights = [make_backend(name, cfg) for name in ("cuda", "mlx")]
    for backend in weights:
        backend.load_params(init_params(cfg))
    a, b = (w.params() for w in weights)
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "features",
    [*MODELS.values(), dict(tie_embeddings=False), dict(LOOPS_LANES, parallel_final_lane="mlp")],
    ids=[*MODELS, "untied", "loops_lanes"],
)
def test_same_weights_same_logits_and_loss(sotu_dataset, features):
    cfg = sotu_dataset.config(**features)
    params = busy_params(cfg, seed=11)
    x, y = batch(cfg, n=3, seed=12)
    torch_b, mlx_b = make_backend("cuda", cfg), make_backend("mlx", cfg)
    torch_b.load_params(params)
    mlx_b.load_params(params)
    for looping in (False, True) if cfg.num_loops else (False,):
        torch_b.set_looping(looping)
        mlx_b.set_looping(looping)
        np.testing.assert_allclose(
            mlx_b.logits(x), torch_b.logits(x), rtol=0, atol=2e-5, err_msg=f"{looping=}"
        )
        assert float(mlx_b.eval_nll(x, y)) == pytest.approx(float(torch_b.eval_nll(x, y)), rel=1e-5)


MIXED = {
    "quant_format": "mixed",
    "compressor": "brotli",
    "byte_shuffle": 2,
    "attn_bits": 5,
    "lqer_enabled": True,
}


# A wide MLP: its matrices (1280 x 64) pass the 65,536-element floor, so they are quantized. pergroup
# compresses what mixed writes (the same quantized tensors, grouped and ordered by numpy): one model.
@pytest.mark.parametrize(
    ("model", "artifact"),
    [
        *(pytest.param(m, {"mlp_mult": 20.0}, id=f"{m}-int8") for m in MODELS),
        *(
            pytest.param(m, {**MIXED, "mlp_mult": 20.0}, id=f"{m}-mixed", marks=pytest.mark.slow)
            for m in MODELS
        ),
        pytest.param(  # ~15 s: lrzip's ZPAQ on 2 cores
            "features",
            {**MIXED, "mlp_mult": 20.0, "compressor": "pergroup"},
            id="features-pergroup",
            marks=[NEEDS_LRZIP, pytest.mark.slow],
        ),
    ],
)
def test_artifacts_from_the_same_weights_are_byte_identical(sotu_dataset, tmp_path, model, artifact):
    cfg = sotu_dataset.config(**{**MODELS[model], **artifact})
    params = busy_params(cfg, seed=13)
    paths = []
    for name in ("cuda", "mlx"):
        backend = make_backend(name, cfg)
        backend.load_params(params)
        path = tmp_path / f"{name}.pgolf"
        export_artifact(backend.params(), cfg, storage_dtypes(cfg, backend.bf16), path, 0)
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    if cfg.lqer_enabled:  # the corrections are in the file
        assert len(read_artifact(paths[0]).lqer) == cfg.lqer_top_k


@pytest.mark.slow
@pytest.mark.parametrize(("writer", "reader"), DIRECTIONS)
def test_an_artifact_scores_the_same_in_both(sotu_dataset, tmp_path, writer, reader):
    result = run(sotu_dataset, writer, tmp_path, iterations=3)
    artifact = int8_format.dequantize_int8(upstream.load_artifact(result.run_dir / "final_model.int8.pgolf"))
    cfg = sotu_dataset.config()
    backend = make_backend(reader, cfg)
    backend.load_params(artifact)
    meter = evaluate(backend, load_eval_data(cfg))
    assert meter.val_bpb == pytest.approx(result.roundtrip_val_bpb, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("writer", "reader"), DIRECTIONS)
def test_a_checkpoint_resumes_in_the_other_backend(sotu_dataset, tmp_path, writer, reader, model):
    first = run(sotu_dataset, writer, tmp_path, "first", iterations=4, checkpoint_every=2, **MODELS[model])
    ckpt = first.run_dir / "checkpoints" / "step_000002.safetensors"
    assert load_checkpoint(ckpt).backend == writer
    other = run(sotu_dataset, reader, tmp_path, "other", iterations=4, resume=ckpt, **MODELS[model])
    a, b = final_params(first), final_params(other)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-4, err_msg=k)
    # The exported weights (the moving average when on) score alike.
    assert other.roundtrip_val_bpb == pytest.approx(first.roundtrip_val_bpb, abs=1e-4)


@pytest.mark.slow
def test_training_curves_agree(sotu_dataset, tmp_path):
    curves = {}
    for name in ("cuda", "mlx"):
        result = run(sotu_dataset, name, tmp_path, name, iterations=8, warmdown_iters=4)
        curves[name] = [r["train_loss"] for r in read_metrics(result.run_dir) if r["kind"] == "train"]
    assert len(curves["cuda"]) == len(curves["mlx"]) == 8
    np.testing.assert_allclose(curves["mlx"], curves["cuda"], rtol=1e-4)
