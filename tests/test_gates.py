"""The gates of the April records: SmearGate (each token embedding takes a gated share of the one before, never
across a document start) and the per-head gates on attention's output (AttnOutGate, gated attention, the sparse
gate)."""

from __future__ import annotations

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.config.fields import ATTENTION_GATES, field_names
from core.config.presets import preset
from core.eval.score import load_eval_data
from core.model.params import init_params
from core.model.walk import GATE_MATH
from tests.reference import reference_logits, smear
from tests.support.backends import BACKENDS, busy_params, make_backend, needs

CFG = preset("smoke").replace(smear_gate_enabled=True, gate_window=8)
# Documents start with BOS (id 1): at positions 0, 3, 4 (an empty document) and 9.
TOKENS = np.array([[1, 17, 250, 1, 1, 999, 64, 3, 77, 1, 12, 5]], dtype=np.int32)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_both_backends_match_the_reference_across_document_starts(backend_name):
    params = busy_params(CFG, seed=2)
    backend = make_backend(backend_name, CFG)
    backend.load_params(params)
    got = backend.logits(TOKENS)
    np.testing.assert_allclose(got, reference_logits(params, CFG, TOKENS), atol=2e-5)
    # The mask matters: the same weights without it give other logits at the starts that follow a token.
    unmasked = reference_logits(params, CFG.replace(bos_id=CFG.vocab_size - 1), TOKENS)
    assert np.abs(unmasked[0, [3, 4, 9]] - got[0, [3, 4, 9]]).max() > 1e-3


def test_a_document_start_takes_nothing_from_the_token_before():
    params = {k: v.astype(np.float64) for k, v in busy_params(CFG, seed=5).items()}
    emb = params["tok_emb.weight"][TOKENS]
    out = smear(params, CFG, emb, TOKENS)
    changed = emb.copy()
    changed[0, [2, 8]] += 1.0  # the tokens before the starts at 3 and 9
    again = smear(params, CFG, changed, TOKENS)
    np.testing.assert_array_equal(again[0, [3, 9]], out[0, [3, 9]])  # starts: untouched
    assert np.abs(again[0, 2] - out[0, 2]).max() > 0  # the changed token itself
    np.testing.assert_array_equal(out[0, 0], emb[0, 0])  # the first token has no token before
    lam = params["smear_lambda"][0]
    gate = lam / (1 + np.exp(-(emb[0, 6, :8] @ params["smear_gate.weight"][0])))
    np.testing.assert_allclose(out[0, 6], emb[0, 6] + gate * emb[0, 5], rtol=1e-12)


@needs("cuda")
def test_fresh_weights_leave_the_embeddings_as_they_are():
    weights = init_params(CFG)
    assert not weights["smear_lambda"].any() and not weights["smear_gate.weight"].any()
    backend, plain = make_backend("cuda", CFG), make_backend("cuda", CFG.replace(smear_gate_enabled=False))
    backend.load_params(weights)
    plain.load_params({k: v for k, v in weights.items() if not k.startswith("smear")})
    np.testing.assert_array_equal(backend.logits(TOKENS), plain.logits(TOKENS))


def test_a_bos_id_the_tokenizer_does_not_use_is_refused(sotu_dataset):
    cfg = sotu_dataset.config(smear_gate_enabled=True, gate_window=8)
    assert load_eval_data(cfg).tokens[0] == cfg.bos_id  # the data's documents start with it
    with pytest.raises(PgolfError, match="bos_id=2, but the tokenizer .* starts documents with 1"):
        load_eval_data(cfg.replace(bos_id=2))


# Each declared gate on (the sparse gate's scale off 1, AttnOutGate also driven by the raw queries).
GATE_SETTINGS = {
    gate.name: {gate.field: True} | ({"sparse_attn_gate_scale": 0.7} if gate.name == "sparse" else {})
    for gate in ATTENTION_GATES
} | {"attn_out_q": {"attn_out_gate_enabled": True, "attn_out_gate_src": "q"}}


def test_every_declared_gate_has_its_math_and_its_field():
    assert set(GATE_MATH) == {gate.name for gate in ATTENTION_GATES}
    assert all(gate.field in field_names() and gate.field.endswith("_enabled") for gate in ATTENTION_GATES)


@pytest.mark.parametrize("gate", list(GATE_SETTINGS))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_attention_gates_match_the_reference_and_decode_alike(backend_name, gate):
    cfg = preset("smoke").replace(gate_window=8, **GATE_SETTINGS[gate])
    params = busy_params(cfg, seed=3)
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    full = backend.logits(TOKENS)
    np.testing.assert_allclose(full, reference_logits(params, cfg, TOKENS), atol=2e-5)
    step = backend.decoder()
    got = [step(TOKENS[0, :4])] + [step(TOKENS[0, i : i + 1]) for i in range(4, TOKENS.shape[1])]
    np.testing.assert_allclose(np.stack(got), full[0, 3:], atol=1e-4)


def test_one_attention_gate_at_a_time():
    with pytest.raises(
        PgolfError, match="attn_out_gate_enabled and sparse_attn_gate_enabled: one attention gate"
    ):
        preset("smoke").replace(attn_out_gate_enabled=True, sparse_attn_gate_enabled=True).validate()
    with pytest.raises(PgolfError, match="gate_window=80 exceeds model_dim=64"):
        preset("smoke").replace(sparse_attn_gate_enabled=True, gate_window=80).validate()
    shapes = {k: v.shape for k, v in init_params(preset("smoke").replace(gated_attn_enabled=True)).items()}
    assert shapes["blocks.0.attn.attn_gate_w"] == (4, 64)  # heads x model_dim: gated attention reads all of x


def test_the_quant_gate_stores_gate_weights_as_int8_rows(tmp_path):
    from core.artifact.export import export_artifact
    from core.artifact.load import load_mixed_artifact
    from core.artifact.mixed import dequantize_mixed
    from core.model.params import storage_dtypes

    cfg = preset("smoke").replace(gated_attn_enabled=True, quant_format="mixed", gated_attn_quant_gate=True)
    params = busy_params(cfg.validate(), seed=6)
    export_artifact(params, cfg, storage_dtypes(cfg, False), tmp_path / "a.pgolf", 0)
    model = load_mixed_artifact(tmp_path / "a.pgolf")
    gates = [n for n in params if n.endswith("attn_gate_w")]
    assert gates and all(
        model.info[n]["method"] == "gate" and model.quantized[n].dtype == np.int8 for n in gates
    )
    assert model.info["blocks.0.attn.q_gain"]["store"] == "fp32"  # other control tensors stay as they were
    back = dequantize_mixed(model)
    for name in gates:  # int8 rows: within half a step of each row's absmax / 127
        step = np.abs(params[name]).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(back[name] - params[name]) <= 0.5 * step * 1.001)
    with pytest.raises(PgolfError, match="gated_attn_quant_gate needs quant_format=mixed"):
        cfg.replace(quant_format="int8").validate()
