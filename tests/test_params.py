"""The parameter table, what is derived from it (initialisation, groups, state, classes), the FLOP count."""

from __future__ import annotations

import numpy as np
import pytest

from core.artifact.load import config_for_params
from core.common.errors import PgolfError
from core.config.presets import preset
from core.model.optim import GROUPS, optimizer_state_shapes
from core.model.params import (
    KINDS,
    artifact_classes,
    count_params,
    flops_per_token,
    init_params,
    param_shapes,
    param_specs,
    round_to_bfloat16,
    storage_dtypes,
)

# Every model switch that adds or changes parameters, on at once.
ALL_SWITCHES = dict(
    num_layers=5, skip_gates_enabled=True, ve_enabled=True, ve_dim=24, ve_layers="3,4", mlp_mult=2.5,
    tie_embeddings=False, ema_decay=0.9, num_loops=1, loop_start=1, loop_end=2, parallel_start_layer=3,
    smear_gate_enabled=True, gate_window=8,
)  # fmt: skip


def test_parameter_counts_are_the_published_ones():
    assert count_params(preset("baseline")) == 17_059_912
    assert count_params(preset("record_0401")) == 34_401_371  # the record's train log: model_params
    assert count_params(preset("record_0427")) == 35_945_671  # the record's seed-42 log: model_params


def test_names_are_the_upstream_state_dict_keys():
    names = list(param_shapes(preset("baseline").replace(num_layers=2)))
    block = [
        "attn.c_q.weight", "attn.c_k.weight", "attn.c_v.weight", "attn.proj.weight", "attn.q_gain",
        "mlp.fc.weight", "mlp.proj.weight", "attn_scale", "mlp_scale", "resid_mix",
    ]  # fmt: skip
    expected = ["tok_emb.weight", "skip_weights"] + [f"blocks.{i}.{b}" for i in range(2) for b in block]
    assert names == expected
    assert "lm_head.weight" in param_shapes(preset("baseline").replace(tie_embeddings=False))


def test_every_row_names_a_known_group_kind_and_init():
    cfg = preset("smoke").replace(**ALL_SWITCHES)
    assert {
        "skip_gates", "ve_shared.embed.weight", "ve_shared.proj.weight", "ve_layer_scales.1",
        "parallel_post_lambdas", "parallel_resid_lambdas",
    } <= set(param_specs(cfg))  # fmt: skip
    for name, spec in param_specs(cfg).items():
        assert spec.group in GROUPS and spec.kind in KINDS, name
        assert spec.init in ("normal", "uniform", "const", "resid_mix"), name
        assert spec.kind != "control" or (spec.group == "scalar" and not spec.low_precision), name
    init = init_params(cfg)
    assert init.keys() == param_specs(cfg).keys()
    assert all(init[n].shape == s.shape for n, s in param_specs(cfg).items())
    state = optimizer_state_shapes(cfg)
    assert {k.split("/")[0] for k in state if "/" in k} == {"momentum_buffer", "exp_avg", "exp_avg_sq", "ema"}
    assert all(f"ema/{n}" in state for n in param_specs(cfg))


def test_loops_and_lanes_rows():
    """0423: skips sized by the looped layout; lane lambdas per physical layer, control tensors."""
    base = preset("baseline").replace(num_layers=11)
    looped = base.replace(num_loops=2, loop_start=3, loop_end=5)  # 8 encoder, 9 decoder visits
    assert param_shapes(looped)["skip_weights"] == (8, 512)
    assert param_shapes(looped.replace(skip_gates_enabled=True))["skip_gates"] == (8, 512)
    assert param_shapes(base)["skip_weights"] == (5, 512)
    assert not any(n.startswith("parallel_") for n in param_specs(looped))  # the baseline's key set
    lanes = base.replace(parallel_start_layer=8)
    specs = param_specs(lanes)
    assert list(specs)[-2:] == ["parallel_post_lambdas", "parallel_resid_lambdas"]
    init = init_params(lanes)
    assert init["parallel_post_lambdas"].shape == (11, 2, 2) and np.all(init["parallel_post_lambdas"] == 1.0)
    assert init["parallel_resid_lambdas"].shape == (11, 2)
    assert np.allclose(init["parallel_resid_lambdas"], 1.1)
    for name in ("parallel_post_lambdas", "parallel_resid_lambdas"):
        assert (specs[name].group, specs[name].kind) == ("scalar", "control")
    # The rows come last and draw nothing, so every other initial weight is unchanged.
    plain = init_params(base)
    assert all(np.array_equal(plain[k], init[k]) for k in plain)


def test_groups():
    specs = param_specs(preset("baseline").replace(tie_embeddings=False))
    shapes = {n: s.shape for n, s in specs.items()}
    groups = {name: spec.group for name, spec in specs.items()}
    assert groups["tok_emb.weight"] == "embed"
    assert groups["lm_head.weight"] == "head"
    assert groups["skip_weights"] == "scalar"
    assert {groups[n] for n in shapes if n.endswith(("q_gain", "attn_scale", "mlp_scale", "resid_mix"))} == {
        "scalar"
    }
    matrices = [n for n, g in groups.items() if g == "matrix"]
    assert len(matrices) == 6 * 9 and all(len(shapes[n]) == 2 for n in matrices)


def test_init_is_deterministic_and_follows_the_upstream_distributions():
    cfg = preset("baseline")
    a, b = init_params(cfg), init_params(cfg)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["tok_emb.weight"], init_params(cfg, seed=1)["tok_emb.weight"])
    assert all(v.dtype == np.float32 and v.shape == param_shapes(cfg)[k] for k, v in a.items())
    assert a["tok_emb.weight"].std() == pytest.approx(0.005, rel=0.01)
    q = a["blocks.0.attn.c_q.weight"]
    assert np.abs(q).max() <= 1 / np.sqrt(512) and q.std() == pytest.approx(
        1 / np.sqrt(512) / np.sqrt(3), rel=0.01
    )
    assert not a["blocks.3.attn.proj.weight"].any() and not a["blocks.3.mlp.proj.weight"].any()
    assert np.all(a["blocks.0.attn.q_gain"] == 1.5)
    assert np.array_equal(a["blocks.0.resid_mix"], np.stack([np.ones(512), np.zeros(512)]))
    assert np.all(a["skip_weights"] == 1) and a["skip_weights"].shape == (4, 512)


def test_bf16_init_holds_bf16_values():
    emb = init_params(preset("smoke"), bf16=True)["tok_emb.weight"]
    assert not (emb.view(np.uint32) & 0xFFFF).any()
    assert storage_dtypes(preset("smoke"), bf16=True)["tok_emb.weight"] == "bfloat16"
    classes = artifact_classes(preset("smoke"))
    assert classes["tok_emb.weight"] == "embedding" and classes["blocks.1.mlp.fc.weight"] == "mlp"
    assert classes["blocks.0.attn.c_k.weight"] == "attention" and classes["blocks.0.resid_mix"] == "control"
    assert set(storage_dtypes(preset("smoke"), bf16=False).values()) == {"float32"}


def test_round_to_bfloat16_matches_torch():
    torch = pytest.importorskip("torch", reason="torch is the reference for bf16 rounding")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=10_000) * 10.0 ** rng.integers(-30, 30, 10_000),
                        [0.0, -0.0, np.inf, -np.inf, 3.0e38, -3.4e38, 1e-40]]).astype(np.float32)  # fmt: skip
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(round_to_bfloat16(x), expected)
    assert np.isnan(round_to_bfloat16(np.array([np.nan], dtype=np.float32))).all()


def test_flops_per_token_matches_the_spec_estimate():
    # The published estimate: 6N + 6*L*d*T = 102.2 + 28.3 = 130.5 MFLOP for the baseline.
    assert flops_per_token(preset("baseline")) / 1e6 == pytest.approx(130.5, abs=0.1)


def test_config_is_read_back_from_the_shapes():
    target = preset("baseline").replace(
        num_layers=5, mlp_mult=3, num_heads=4, num_kv_heads=1, tie_embeddings=False
    )
    got = config_for_params(preset("smoke"), param_shapes(target))
    for name in (
        "num_layers",
        "mlp_mult",
        "num_heads",
        "num_kv_heads",
        "tie_embeddings",
        "model_dim",
        "vocab_size",
    ):
        assert getattr(got, name) == getattr(target, name)


def test_foreign_weights_are_refused():
    shapes = param_shapes(preset("smoke"))
    with pytest.raises(PgolfError, match="layout"):
        config_for_params(preset("smoke"), {k: v for k, v in shapes.items() if k != "tok_emb.weight"})
    with pytest.raises(PgolfError, match="unexpected tensor 'extra'"):
        config_for_params(preset("smoke"), {**shapes, "extra": (3,)})
