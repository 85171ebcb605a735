"""Document-masked attention (varlen_attn_enabled): a token attends only within its segment of the row,
which starts at the row's start, at each BOS and every max_doc_len tokens from a segment's start, the
same in training, scoring, decoding and test-time training's global phase."""

from __future__ import annotations

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.config.presets import preset
from core.eval.score import load_eval_data
from tests.reference import document_mask, reference_logits, reference_loss
from tests.support.backends import BACKENDS, LOOPS_LANES, MODEL_SWITCHES, busy_params, make_backend, needs

# Rows of 40 tokens, longer than max_doc_len (16): row 0 has documents starting at 5, 6 (one token) and
# 20 (cut at 36); row 1 has no BOS, so its one document is cut at 16 and 32.
CFG = preset("smoke").replace(varlen_attn_enabled=True, train_seq_len=16, train_batch_tokens=64)
T = 40
BOS_AT = [5, 6, 20]
pytestmark = pytest.mark.cuda  # its CUDA branch: FlashAttention's varlen kernel, or the masked SDPA


def packed_rows(cfg, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(2, cfg.vocab_size, size=(2, T)).astype(np.int32)
    x[0, BOS_AT] = cfg.bos_id
    return x, rng.integers(0, cfg.vocab_size, size=(2, T)).astype(np.int32)


def loaded(backend_name: str, cfg, params):
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    return backend


def test_segments_are_cut_at_bos_and_every_max_doc_len():
    assert CFG.max_doc_len == 16
    x, _ = packed_rows(CFG)
    mask = document_mask(CFG, x)
    first = mask.argmax(axis=-1)  # the first key each query sees
    starts = [0, 5, 6, 20, 36]
    expected = np.repeat(starts, np.diff([*starts, T]))
    np.testing.assert_array_equal(first[0], expected)
    np.testing.assert_array_equal(first[1], np.repeat([0, 16, 32], [16, 16, 8]))
    assert document_mask(CFG.replace(varlen_attn_enabled=False), x)[:, :, 0].all()  # off: plain causal


@pytest.mark.parametrize(
    "features", [{}, dict(MODEL_SWITCHES, **LOOPS_LANES, ve_layers="2,4")], ids=["plain", "all"]
)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_packed_rows_match_the_reference(backend_name, features):
    cfg = CFG.replace(**features)
    params = busy_params(cfg, seed=1)
    backend = loaded(backend_name, cfg, params)
    x, y = packed_rows(cfg)
    for looping in (False, True) if cfg.num_loops else (False,):
        backend.set_looping(looping)
        np.testing.assert_allclose(backend.logits(x), reference_logits(params, cfg, x, looping), atol=1e-4)
        loss = reference_loss(params, cfg, x, y, looping)
        assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(loss, rel=2e-5)
        z = reference_logits(params, cfg, x, looping)
        z = z - z.max(-1, keepdims=True)
        nll = np.log(np.exp(z).sum(-1)) - np.take_along_axis(z, y[..., None], -1)[..., 0]
        np.testing.assert_allclose(backend.token_losses(x, y), nll, atol=1e-4)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_token_of_an_earlier_document_does_not_reach_a_later_one(backend_name):
    cfg = CFG.replace(smear_gate_enabled=True, gate_window=8)  # SmearGate stops at a BOS too
    params = busy_params(cfg, seed=2)
    x, _ = packed_rows(cfg)
    changed = x.copy()
    changed[0, 3] = 7  # document 0 (0..4)
    changed[1, 4] = 7  # the first piece (0..15) of row 1's document
    masked, plain = (
        loaded(backend_name, cfg, params),
        loaded(backend_name, cfg.replace(varlen_attn_enabled=False), params),
    )
    for backend, reaches in ((masked, False), (plain, True)):
        moved = np.abs(backend.logits(changed) - backend.logits(x)).max(-1)
        assert moved[0, 3] > 1e-3 and moved[1, 4] > 1e-3
        later = np.concatenate([moved[0, 5:], moved[1, 16:]])
        if reaches:
            assert later.min() > 1e-4
        else:
            np.testing.assert_allclose(later, 0.0, atol=1e-6)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_decoding_one_token_at_a_time_follows_the_segments(backend_name):
    """The cache keeps where the last document started: a BOS, or the max_doc_len cut, among the
    decoded tokens ends what the next ones see, as in the full forward."""
    cfg = CFG.replace(smear_gate_enabled=True, gate_window=8)
    backend = loaded(backend_name, cfg, busy_params(cfg, seed=3))
    x, _ = packed_rows(cfg)
    full = backend.logits(x)
    for row in (0, 1):
        decode = backend.decoder()
        got = [decode(x[row, :3])] + [decode(x[row, t : t + 1]) for t in range(3, T)]
        np.testing.assert_allclose(np.stack(got), full[row, 2:], atol=2e-5)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_training_and_both_backends_use_the_mask(backend_name):
    """train_step's loss (taken before its update) is the masked model's, which plain attention's is not."""
    params = busy_params(CFG, seed=4)
    x, y = packed_rows(CFG)
    loss = float(loaded(backend_name, CFG, params).train_step([(x, y)], 1.0, 0.9))
    assert loss == pytest.approx(reference_loss(params, CFG, x, y), rel=2e-5)
    plain = reference_loss(params, CFG.replace(varlen_attn_enabled=False), x, y)
    assert abs(loss - plain) > 1e-3


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_global_phase_follows_respect_doc_boundaries(backend_name):
    """sgd_step with doc_mask off (global_ttt_respect_doc_boundaries=0) trains as the unmasked model does;
    on, as the masked one."""
    params = busy_params(CFG, seed=5)
    x, y = packed_rows(CFG)

    def after(cfg, doc_mask: bool) -> dict[str, np.ndarray]:
        backend = loaded(backend_name, cfg, params)
        ttt = backend.ttt()
        ttt.sgd_reset(0.9)
        ttt.sgd_step(x, y, 0.05, y.size, 1.0, doc_mask)
        return backend.params()

    masked, unmasked = after(CFG, True), after(CFG, False)
    plain = after(CFG.replace(varlen_attn_enabled=False), True)
    name = "blocks.0.attn.c_q.weight"
    np.testing.assert_allclose(unmasked[name], plain[name], atol=1e-6)
    assert np.abs(masked[name] - plain[name]).max() > 1e-5
    # The flag is a switch of the step only: the model is masked again afterwards.
    backend = loaded(backend_name, CFG, params)
    ttt = backend.ttt()
    ttt.sgd_reset(0.9)
    ttt.sgd_step(x, y, 0.0, y.size, 1.0, False)
    np.testing.assert_allclose(backend.logits(x), reference_logits(params, CFG, x), atol=1e-4)


def test_a_bos_id_the_tokenizer_does_not_use_is_refused(sotu_dataset):
    cfg = sotu_dataset.config(varlen_attn_enabled=True)
    load_eval_data(cfg)
    with pytest.raises(PgolfError, match="bos_id=2, but .* attention would reach across document starts"):
        load_eval_data(cfg.replace(bos_id=2))


@needs("cuda")
def test_the_flash_varlen_path_lays_segments_end_to_end(monkeypatch):
    """cuda_train's call of FlashAttention's varlen kernel (CUDA only), run on a CPU with the golden
    scripts' exact per-sequence stand-in for the kernel: the same as the masked SDPA it replaces."""
    import torch

    from cuda_train import model as torch_model
    from cuda_train import varlen
    from tests.golden.record_code import flash_attn_varlen_func_sdpa

    monkeypatch.setattr(varlen, "flash_varlen", lambda: flash_attn_varlen_func_sdpa)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, T, 8, generator=g) for n in (4, 2, 2))  # (B, H or KV, T, D)
    x, _ = packed_rows(CFG)
    lower = torch.from_numpy(document_mask(CFG, x).argmax(-1))
    got = varlen.varlen_attention(q, k, v, lower)
    want = torch_model.causal_attention(q, k, v, expand_kv=False, lower=lower)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
