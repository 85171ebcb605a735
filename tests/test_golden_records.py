"""The challenge records' own numbers, reproduced by both backends.

`tests/golden/record_features.safetensors` was written by
`tests/golden/make_record_features.py` (not run here) from the records' code, in
float32 on a CPU. Each case's hyperparameters are the record's environment
variables, kept as JSON in the file's metadata; pgolf reads them with
`core.config.from_env`, the same mapping a user's environment gets.

Tolerances: logits within 2e-5 absolute, losses within 1e-5 relative (fp32 round-off).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.config import from_env, preset
from core.params import num_skip_weights, param_shapes
from tests.test_backends import BACKENDS, make_backend

GOLDEN = Path(__file__).resolve().parent / "golden" / "record_features.safetensors"

# The 04-23 record keeps each kind of block matrix of all layers in one bank; the generator
# built the banks from the 04-04 model's per-block tensors (`loop/param/blocks.{i}.*`), whose
# names are pgolf's: qo_bank = [c_q ..., proj ...], kv_bank = [c_k ..., c_v ...],
# mlp_up_bank = [fc ...], mlp_down_bank = [proj ...].
BANKED = ("attn.c_q.weight", "attn.proj.weight", "attn.c_k.weight", "attn.c_v.weight", "mlp.fc.weight",
          "mlp.proj.weight")  # fmt: skip


@pytest.fixture(scope="module")
def golden() -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    if not GOLDEN.is_file():
        pytest.skip(f"golden file not found: {GOLDEN}")
    from safetensors import safe_open

    with safe_open(str(GOLDEN), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        meta = {k: json.loads(v) for k, v in f.metadata().items()}
    return tensors, meta


def record_config(env: dict[str, str]):
    """pgolf's config for a record's environment: fp32, eager, the record's fixed choices."""
    # Variables pgolf has no field for, at the values its model implies.
    assert env.get("EMBEDDING_DIM", env["MODEL_DIM"]) == env["MODEL_DIM"]
    assert env.get("EVAL_SEQ_LEN", env["TRAIN_SEQ_LEN"]) == env["TRAIN_SEQ_LEN"]
    assert env.get("FUSED_CE_ENABLED", "0") == "0"
    # Not environment switches in the record: leaky-ReLU(0.5)^2 MLP (the rest is pgolf's baseline).
    return (
        preset("smoke")
        .replace(**from_env(env), mlp_activation="leaky_relu2", compute_dtype="float32", compile="off")
        .validate()
    )


def loop0423(golden):
    tensors, meta = golden
    case = meta["loop0423"]
    cfg = record_config(case["env"])
    params = {
        k.removeprefix("loop0423/param/"): v for k, v in tensors.items() if k.startswith("loop0423/param/")
    }
    for i in range(cfg.num_layers):
        for suffix in BANKED:
            params[f"blocks.{i}.{suffix}"] = tensors[f"loop/param/blocks.{i}.{suffix}"]
    return cfg, case, params, tensors["loop/x"], tensors["loop/y"]


def test_loop0423_layout_is_the_records(golden):
    cfg, case, params, _, _ = loop0423(golden)
    assert cfg.layer_layout(looping=True) == (case["encoder_on"], case["decoder_on"])
    assert cfg.layer_layout(looping=False) == (case["encoder_off"], case["decoder_off"])
    assert num_skip_weights(cfg) == case["num_skip_weights"]
    assert cfg.parallel_final_lane == case["parallel_final_lane"]
    assert {k: v.shape for k, v in params.items()} == param_shapes(cfg)


@pytest.mark.parametrize("looping", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_loop0423_logits_and_loss(golden, backend_name, looping):
    """Depth recurrence (NUM_LOOPS=2, layers 1..2) and parallel lanes (from layer 4), 04-23 form."""
    cfg, _, params, x, y = loop0423(golden)
    tensors = golden[0]
    state = "on" if looping else "off"
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    backend.set_looping(looping)
    np.testing.assert_allclose(backend.logits(x), tensors[f"loop0423/logits_{state}"], rtol=0, atol=2e-5)
    loss = backend.eval_nll(x, y) / y.size
    assert loss == pytest.approx(float(tensors[f"loop0423/loss_{state}"]), rel=1e-5)
