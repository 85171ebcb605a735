"""Both backends against numbers computed once by the challenge records' own code.

The golden files in tests/golden/ were written by the scripts beside them (not run
here), which import a record's train_gpt.py and run its own functions on a CPU in
fp32 at small shapes (FlashAttention replaced by PyTorch's SDPA, Newton-Schulz in
fp32; each script's docstring lists what it substitutes). pgolf uses the records'
parameter names, so the weights load as they are.

Tolerances: logits 2e-5 absolute, losses 1e-5 relative, one optimizer step 2e-5
absolute (fp32 round-off, the same bounds as the numpy reference tests). Where a
golden file keeps a record's environment variables, pgolf reads them with
`core.config.sources.from_env`, the same mapping a user's environment gets.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.artifact import lqer, rowquant
from core.config.fields import Config
from core.config.presets import preset
from core.model.optim import base_lr, muon_scale, newton_schulz, ns_coefficients
from core.model.params import ParamSpec, num_skip_weights, param_shapes, param_specs
from core.model.schedule import lr_multiplier, muon_wd_multiplier
from tests.golden_data import GOLDEN, read_golden, record_config
from tests.reference import document_mask
from tests.support.backends import BACKENDS, make_backend

RECORD_0401 = GOLDEN / "record_0401.safetensors"

# The record's hyperparameters that are pgolf config fields of the same name.
SHARED_FIELDS = (
    "vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "rope_base", "rope_dims",
    "train_seq_len", "ln_scale", "xsa_last_n", "ve_enabled", "ve_dim", "ve_layers", "skip_gates_enabled",
    "qk_gain_init", "logit_softcap", "tie_embeddings", "embed_lr", "head_lr", "tied_embed_lr", "matrix_lr",
    "scalar_lr", "muon_backend_steps", "beta1", "beta2", "adam_eps", "grad_clip_norm", "adam_wd", "muon_wd",
    "embed_wd", "ema_decay",
)  # fmt: skip


def record_0401_case(case: str):
    """(config, weights, tensors) of one case of the 2026-04-01 record's goldens."""
    meta, tensors = read_golden(RECORD_0401, f"{case}/")
    hparams = json.loads(meta[f"{case}/hparams"])
    cfg = preset("smoke").replace(
        **{k: hparams[k] for k in SHARED_FIELDS},
        mlp_activation="leaky_relu2",  # the record's only MLP
        train_batch_tokens=hparams["batch"][0] * hparams["batch"][1],
        grad_accum_steps=1,
        compute_dtype="float32",
        compile="off",
    )
    # The golden files store the record's 0-d tensors (ve_shared.scale) with shape (1,).
    shapes = param_shapes(cfg)
    for key in [k for k in tensors if k.split("/", 1)[-1] in shapes]:
        tensors[key] = tensors[key].reshape(shapes[key.split("/", 1)[-1]])
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    return cfg, params, tensors, hparams


def record_0401_backend(backend_name: str, case: str):
    """(config, a backend holding the case's weights, the case's tensors, its hyperparameters)."""
    cfg, params, golden, hparams = record_0401_case(case)
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    return cfg, backend, golden, hparams


CASES = ["case_full", "case_plain", "case_untied"]  # case_embproj: embedding_dim != model_dim is not in pgolf


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_record_0401_forward(backend_name, case):
    _, backend, golden, _ = record_0401_backend(backend_name, case)
    x, y = golden["x"].astype(np.int32), golden["y"].astype(np.int32)
    np.testing.assert_allclose(backend.logits(x), golden["logits"], rtol=0, atol=2e-5)
    assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(float(golden["loss"][0]), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_record_0401_optimizer_step_and_ema(backend_name, case):
    """One step: grad clip 0.3, Muon with decoupled WD, AdamW on embeddings and scalars, then the EMA."""
    cfg, backend, golden, hparams = record_0401_backend(backend_name, case)
    x, y = golden["x"].astype(np.int32), golden["y"].astype(np.int32)
    backend.train_step([(x, y)], hparams["lr_mult"], hparams["muon_momentum"])
    got = backend.params()
    after = {k.removeprefix("after_step/"): v for k, v in golden.items() if k.startswith("after_step/")}
    assert got.keys() == after.keys()
    specs = param_specs(cfg)
    for name, expected in after.items():
        # Adam's first step is lr * g / (|g| + eps): where fp32 sums cancel to |g| ~ eps (1e-8) it turns
        # round-off into differences up to ~1e-4 of the lr (seen: 3.9e-5 at the untied embed lr of 0.42).
        lr = base_lr(cfg, specs[name].group) * hparams["lr_mult"]
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=2e-5 + 1e-4 * lr, err_msg=name)
    ema = {k.removeprefix("ema/"): v for k, v in golden.items() if k.startswith("ema/")}
    state = backend.optimizer_state()
    for name, expected in ema.items():  # stored for case_full
        np.testing.assert_allclose(state[f"ema/{name}"], expected, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("min_lr", [0.0, 0.1])
@pytest.mark.parametrize("cap_s", [0, 60])
def test_record_0401_lr_schedule(min_lr, cap_s):
    _, table = read_golden(RECORD_0401, "lr_table/")
    steps, elapsed = table["step"], table["elapsed_ms"]
    expected = table[f"min_lr_{min_lr}_cap_{cap_s}s/lr_mul"]
    cfg = preset("smoke").replace(
        iterations=100, warmdown_frac=0.667, min_lr=min_lr, max_wallclock_seconds=float(cap_s)
    )
    got = np.array([[lr_multiplier(cfg, int(s), float(t)) for t in elapsed] for s in steps])
    np.testing.assert_allclose(got, expected.reshape(got.shape), rtol=1e-12, atol=0)


# ------------------------------------------------- records 2026-04-04 and 2026-04-23: Muon variants
RECORD_FEATURES = GOLDEN / "record_features.safetensors"
FRAMEWORKS = ["numpy", *(p.id for p in BACKENDS)]


def as_framework(name: str, a: np.ndarray):
    """The array in the framework a backend's optimizer computes with ('cuda' = torch)."""
    if name == "cuda":
        import torch

        return torch.from_numpy(a)
    if name == "mlx":
        import mlx.core as mx

        return mx.array(a)
    return a


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    ("variant", "coefficients", "rows"),
    [("classic", "quintic", False), ("polar", "polar_express", False),
     ("muoneqr_classic", "quintic", True), ("muoneqr_polar", "polar_express", True)],
)  # fmt: skip
def test_newton_schulz_variants(framework, variant, coefficients, rows):
    """core.model.optim.newton_schulz (the one both backends call) on numpy, torch and MLX arrays."""
    if framework != "numpy":
        pytest.importorskip({"cuda": "torch", "mlx": "mlx"}[framework])
    _, golden = read_golden(RECORD_FEATURES, "ns/")
    cfg = preset("smoke").replace(muon_backend_steps=5, muon_ns_coefficients=coefficients)
    for i in range(3):
        g = golden[f"in{i}"].astype(np.float32)
        out = newton_schulz(as_framework(framework, g), ns_coefficients(cfg), row_normalize=rows)
        out = out.numpy() if framework == "cuda" else np.array(out)
        if rows:  # the row-normalised goldens are whole Muon updates: NS times the shape scale
            out = out * muon_scale(*g.shape)
        np.testing.assert_allclose(
            out, golden[f"{variant}/out{i}"], rtol=0, atol=2e-5, err_msg=f"{variant} {i}"
        )


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_muoneqr_two_steps(backend_name):
    """Record 2026-04-04's Muon (row normalisation, classic NS, decoupled WD) through each backend's optimizer."""
    meta, golden = read_golden(RECORD_FEATURES, "muoneqr/")
    info = json.loads(meta["muoneqr"])
    names = sorted(info["shapes"])
    cfg = preset("smoke").replace(
        matrix_lr=info["lr"], muon_wd=info["weight_decay"], muon_row_normalize=True, muon_backend_steps=5
    )
    specs = {n: ParamSpec(tuple(info["shapes"][n]), "uniform", "matrix", "attention") for n in names}
    step_fn = muon_stepper(
        backend_name, cfg, specs, {n: golden[f"before/{n}"] for n in names}, info["momentum"]
    )
    for step in (1, 2):
        params = step_fn({n: golden[f"grad{step}/{n}"] for n in names})
        for n in names:
            np.testing.assert_allclose(params[n], golden[f"after{step}/{n}"], rtol=0, atol=2e-6, err_msg=n)


def muon_stepper(backend_name, cfg, specs, params, momentum):
    """A function taking grads to the parameters after one more step of the backend's own Muon code."""
    if backend_name == "cuda":
        import torch

        from cuda_train.optim import Muon, orthogonaliser

        tensors = {n: torch.nn.Parameter(torch.from_numpy(params[n].copy())) for n in specs}
        opt = Muon(
            list(tensors.values()), cfg.matrix_lr, momentum, cfg.muon_wd, orthogonaliser(cfg, False, False)
        )

        def torch_step(grads):
            for n, p in tensors.items():
                p.grad = torch.from_numpy(grads[n].copy())
            opt.step()
            return {n: p.detach().numpy().copy() for n, p in tensors.items()}

        return torch_step
    import mlx.core as mx

    from mlx_train.optim import Optimizers

    optimizers, current = Optimizers(cfg, specs), {n: mx.array(v) for n, v in params.items()}

    def mlx_step(grads):
        nonlocal current
        grads = {n: mx.array(v) for n, v in grads.items()}
        current = optimizers.apply(current, grads, mx.array(1.0), mx.array(momentum))
        return {n: np.array(v) for n, v in current.items()}

    return mlx_step


# ------------------------------------------------- record 2026-04-23: depth recurrence, parallel lanes
# The 04-23 record keeps each kind of block matrix of all layers in one bank; the generator
# built the banks from the 04-04 model's per-block tensors (`loop/param/blocks.{i}.*`), whose
# names are pgolf's: qo_bank = [c_q ..., proj ...], kv_bank = [c_k ..., c_v ...],
# mlp_up_bank = [fc ...], mlp_down_bank = [proj ...].
BANKED = ("attn.c_q.weight", "attn.proj.weight", "attn.c_k.weight", "attn.c_v.weight", "mlp.fc.weight",
          "mlp.proj.weight")  # fmt: skip


@pytest.fixture(scope="module")
def golden() -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    meta, tensors = read_golden(RECORD_FEATURES, "")
    return tensors, {k: json.loads(v) for k, v in meta.items()}


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
    loss = float(backend.eval_nll(x, y)) / y.size
    assert loss == pytest.approx(float(tensors[f"loop0423/loss_{state}"]), rel=1e-5)


# ------------------------------------------------- 2026-04-27: SmearGate with its BOS mask
RECORD_0427 = GOLDEN / "record_0427.safetensors"


@pytest.fixture(scope="module")
def smear0427():
    meta, tensors = read_golden(RECORD_0427, "")
    case = json.loads(meta["cases"])["cases"]["smear"]
    cfg = record_config(case["env"]).replace(bos_id=case["bos_id"])
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    return cfg, case, params, tensors


def test_smear0427_model_is_the_records(smear0427):
    cfg, case, params, _ = smear0427
    assert cfg.smear_gate_enabled and cfg.gate_window == 8
    assert cfg.layer_layout(looping=True) == (case["encoder_on"], case["decoder_on"])
    assert {k: v.shape for k, v in params.items()} == param_shapes(cfg)


@pytest.mark.parametrize("looping", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_smear0427_logits_and_loss(smear0427, backend_name, looping):
    """SmearGate (GATE_WINDOW=8) masked at BOS, with depth recurrence and parallel lanes, 04-27 form."""
    cfg, _, params, tensors = smear0427
    state = "on" if looping else "off"
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    backend.set_looping(looping)
    x, y = tensors["x"], tensors["y"]
    np.testing.assert_allclose(backend.logits(x), tensors[f"logits_{state}"], rtol=0, atol=2e-5)
    assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(float(tensors[f"loss_{state}"]), rel=1e-5)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_smear0427_without_the_mask(smear0427, backend_name):
    """The record's model with its BOS_ID absent from the tokens smears everywhere; pgolf with such a
    bos_id does the same, and the mask moves the logits well beyond the tolerance."""
    cfg, _, params, tensors = smear0427
    backend = make_backend(backend_name, cfg.replace(bos_id=0))
    backend.load_params(params)
    backend.set_looping(True)
    got = backend.logits(tensors["x"])
    np.testing.assert_allclose(got, tensors["logits_nomask_on"], rtol=0, atol=2e-5)
    assert np.abs(tensors["logits_nomask_on"] - tensors["logits_on"]).max() > 1e-2


@pytest.mark.parametrize("gate", ["attn_out_proj", "attn_out_q", "gated", "sparse"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_attention_gates_0427(backend_name, gate):
    """Each attention gate of record 2026-04-27 (AttnOutGate from the input or the raw queries, gated
    attention, the sparse gate at scale 0.7), with loops and lanes: its own model's logits and loss."""
    meta, tensors = read_golden(RECORD_0427, f"{gate}/")
    cfg = record_config(json.loads(meta["cases"])["cases"][gate]["env"])
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    backend.set_looping(True)
    shared = read_golden(RECORD_0427, "")[1]
    x, y = shared["x"], shared["y"]
    np.testing.assert_allclose(backend.logits(x), tensors["logits_on"], rtol=0, atol=2e-5)
    assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(float(tensors["loss_on"]), rel=1e-5)


# ------------------------------------------------- 2026-04-27: document-masked (varlen) attention
RECORD_VARLEN = GOLDEN / "record_varlen.safetensors"


@pytest.fixture(scope="module")
def varlen0427():
    meta, tensors = read_golden(RECORD_VARLEN, "")
    case = json.loads(meta["cases"])
    cfg = record_config(case["env"]).replace(bos_id=case["bos_id"], varlen_attn_enabled=True)
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    return cfg, case, params, tensors


def test_varlen0427_segments_are_the_records(varlen0427):
    """The record's cu_seqlens (padded with the row's length) are where pgolf's segments start."""
    cfg, case, _, tensors = varlen0427
    assert cfg.max_doc_len == case["max_doc_len"]
    cuts = sorted(set(tensors["cu_seqlens"].tolist()) - {tensors["x"].shape[1]})
    first = document_mask(cfg, tensors["x"])[0].argmax(axis=-1)  # the first key each token sees
    assert sorted(set(first.tolist())) == cuts
    # The first segment sees what plain causal attention sees: the record's varlen stand-in is exact there.
    np.testing.assert_allclose(
        tensors["logits_on"][0, : cuts[1]], tensors["logits_dense_on"][0, : cuts[1]], atol=1e-6
    )


@pytest.mark.parametrize("looping", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_varlen0427_packed_row_logits_and_loss(varlen0427, backend_name, looping):
    """One packed row of 96 tokens, BOS at 5, 6, 20, 70, a document cut at 32 tokens: the record's
    forward with cu_seqlens; the same weights with plain attention give the record's dense logits."""
    cfg, _, params, tensors = varlen0427
    state = "on" if looping else "off"
    x, y = tensors["x"], tensors["y"]
    for masked in (True, False) if looping else (True,):
        backend = make_backend(backend_name, cfg.replace(varlen_attn_enabled=masked))
        backend.load_params(params)
        backend.set_looping(looping)
        want = tensors[f"logits_{state}" if masked else "logits_dense_on"]
        np.testing.assert_allclose(backend.logits(x), want, rtol=0, atol=2e-5, err_msg=f"{masked=}")
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    backend.set_looping(looping)
    assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(float(tensors[f"loss_{state}"]), rel=1e-5)
    assert np.abs(tensors["logits_dense_on"] - tensors["logits_on"]).max() > 1e-2


# ------------------------------------------------- 2026-04-18: the Muon weight-decay taper
@pytest.mark.parametrize("setting", ["record", "early"])
def test_wd_taper_0418(setting):
    meta, tensors = read_golden(GOLDEN / "record_0418.safetensors", f"taper/{setting}/")
    info = json.loads(meta["cases"])
    start, final = info["settings"][setting]
    cfg = Config(iterations=info["iterations"], max_wallclock_seconds=0.0, wd_taper_start_frac=start,
                 wd_taper_final_mult=final)  # fmt: skip
    by_step = [muon_wd_multiplier(cfg, int(s), 0.0) for s in tensors["step/step"]]
    np.testing.assert_allclose(by_step, tensors["step/mul"], rtol=0, atol=1e-12)
    capped = cfg.replace(
        max_wallclock_seconds=600.0, gptq_enabled=True, quant_format="mixed", gptq_reserve_seconds=4.0
    )
    assert 1000.0 * capped.train_cap_seconds == info["cap_ms"]
    by_clock = [muon_wd_multiplier(capped, 0, float(ms)) for ms in tensors["wall/elapsed_ms"]]
    np.testing.assert_allclose(by_clock, tensors["wall/mul"], rtol=0, atol=1e-12)


# ------------------------------------------------- 2026-04-27: LQER's packing, bit for bit
def test_lqer_packing_and_dequantization_are_the_records():
    _, g = read_golden(RECORD_0427, "lqer/")
    a, b = g["A"], g["B"]
    packs = {"sym3": lqer.pack_sym(a, b, 3), "sym4": lqer.pack_sym(a, b, 4), "asym": lqer.pack_asym(a, b, 64)}
    for name, packed in packs.items():
        for key in ("qA", "sA", "qB", "sB"):
            want = g[f"{name}/{key}"]
            assert packed[key].dtype == want.dtype and packed[key].shape == want.shape, (name, key)
            np.testing.assert_array_equal(packed[key], want, err_msg=f"{name}/{key}")
    w_q = g["q"].astype(np.float32) * g["s"].astype(np.float32)[:, None]
    for name in ("sym4", "asym"):
        got = w_q + lqer.correction(packs[name])
        np.testing.assert_allclose(got, g[f"W_{name}"], rtol=0, atol=1e-6)


def test_attention_gate_int8_rows_are_the_records():
    _, g = read_golden(RECORD_0427, "gate_int8/")
    for i in (0, 1):
        q, s = rowquant.absmax_rows(g[f"w{i}"], 127, -127, 127)  # the mixed format's gate rows
        np.testing.assert_array_equal(q, g[f"q{i}"])
        np.testing.assert_array_equal(s, g[f"s{i}"])
        assert q.dtype == np.int8 and s.dtype == np.float16
