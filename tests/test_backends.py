"""Each backend against the independent numpy reference: forward, optimizer steps, state.

Every test runs for both backends (`cuda` = PyTorch, here on the CPU; `mlx`), in
fp32 on the smoke model. Tolerances are fp32 round-off: 2e-5 relative on losses,
1e-4 absolute on logits of size ~1, 2e-5 on parameters after one step.
"""

from __future__ import annotations

import contextlib
import importlib.util

import numpy as np
import pytest

from core.config.presets import preset
from core.model import backend as backends
from core.model import memory
from core.model.optim import GROUPS, base_lr, weight_decay
from core.model.params import param_shapes, param_specs
from tests.reference import reference_adam_update, reference_logits, reference_loss, reference_muon_update
from tests.support.backends import (
    BACKENDS,
    LOOPS_LANES,
    MODEL_SWITCHES,
    SMALL_LOOPS_LANES,
    batch,
    busy_params,
    make_backend,
)


def fresh_compile_cache(name: str) -> None:
    """Forget earlier tests' compiled graphs: dynamo keeps at most 8 per code object, and every
    model instance of the session adds its own (a limit a single run never reaches)."""
    if name == "cuda":
        import torch._dynamo

        torch._dynamo.reset()


def gradients(backend, name: str, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """d(mean CE)/d(param) from the framework's autodiff on the backend's own model."""
    if name == "cuda":
        import torch

        model = backend.model
        model.zero_grad(set_to_none=True)
        model(torch.from_numpy(x).long(), torch.from_numpy(y).long()).backward()
        return {n: p.grad.double().numpy() for n, p in model.named_parameters()}
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    _, grads = nn.value_and_grad(backend.model, backend.model.loss)(mx.array(x), mx.array(y))
    return {n: np.array(g, dtype=np.float64) for n, g in tree_flatten(grads)}


@pytest.mark.parametrize("features", [{}, LOOPS_LANES], ids=["plain", "loops_lanes"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_parameters_are_the_canonical_ones_and_round_trip(backend_name, features):
    cfg = preset("smoke").replace(tie_embeddings=False, **features)
    backend = make_backend(backend_name, cfg)
    params = busy_params(cfg)
    backend.load_params(params)
    got = backend.params()
    assert list(got) == list(param_shapes(cfg)) or set(got) == set(param_shapes(cfg))
    assert all(got[k].dtype == np.float32 and np.array_equal(got[k], v) for k, v in params.items())


@pytest.mark.cuda
@pytest.mark.parametrize(
    "features",
    [
        dict(tie_embeddings=True, num_layers=3),  # odd depth: one unpaired block
        dict(tie_embeddings=False, num_layers=3),
        dict(MODEL_SWITCHES, num_layers=3),
        dict(LOOPS_LANES, mlp_activation="leaky_relu2"),
        # Layer 1 looped alone: 7 visits [0, 1, 1, 1, 2, 3, 4], a shorter encoder; the head reads lane 0.
        dict(LOOPS_LANES, loop_end=1, parallel_final_lane="attn", tie_embeddings=False),
        dict(MODEL_SWITCHES, **LOOPS_LANES, ve_layers="2,4"),  # everything at once
    ],
    ids=["tied", "untied", "features", "loops_lanes", "loop1_attn_lane", "all"],
)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_forward_matches_the_reference(backend_name, features):
    cfg = preset("smoke").replace(**features)
    backend = make_backend(backend_name, cfg)
    params = busy_params(cfg)
    backend.load_params(params)
    x, y = batch(cfg)
    for looping in (False, True) if cfg.num_loops else (False,):
        backend.set_looping(looping)
        expected = reference_logits(params, cfg, x, looping)
        np.testing.assert_allclose(backend.logits(x), expected, rtol=0, atol=1e-4, err_msg=f"{looping=}")
        loss = reference_loss(params, cfg, x, y, looping)
        assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(loss, rel=2e-5)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_train_steps_equal_the_hand_computed_updates(backend_name, decay):
    cfg = preset("smoke").replace(tie_embeddings=False)
    if decay:
        cfg = cfg.replace(muon_wd=0.3, embed_wd=0.2, adam_wd=0.1)
    backend = make_backend(backend_name, cfg)
    params = {k: v.astype(np.float64) for k, v in busy_params(cfg).items()}
    backend.load_params(params)
    state = {k: np.zeros_like(v) for k, v in params.items()}
    second = {k: np.zeros_like(v) for k, v in params.items()}
    micro = [batch(cfg, seed=1), batch(cfg, seed=2)]
    for step, (lr_mult, momentum) in enumerate([(0.7, 0.9), (0.5, 0.93)], start=1):
        grads = [gradients(backend, backend_name, x, y) for x, y in micro]
        grad = {k: (grads[0][k] + grads[1][k]) / 2 for k in params}  # mean over micro-batches
        backend.train_step(micro, lr_mult, momentum)
        specs = param_specs(cfg)
        for name in params:
            lr = base_lr(cfg, specs[name].group) * lr_mult
            wd = weight_decay(cfg, specs[name].group)
            if GROUPS[specs[name].group].muon:
                params[name], state[name] = reference_muon_update(
                    params[name], grad[name], state[name], lr, momentum, cfg.muon_backend_steps, wd
                )
            else:
                params[name], state[name], second[name] = reference_adam_update(
                    params[name],
                    grad[name],
                    state[name],
                    second[name],
                    step,
                    lr,
                    cfg.beta1,
                    cfg.beta2,
                    cfg.adam_eps,
                    wd,
                )
        got = backend.params()
        for name in params:
            np.testing.assert_allclose(
                got[name], params[name], rtol=0, atol=2e-5, err_msg=f"{name} at step {step}"
            )
    assert int(backend.optimizer_state()["step"]) == 2


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_optimizer_state_round_trip_continues_identically(backend_name):
    cfg = preset("smoke")
    a = make_backend(backend_name, cfg)
    a.load_params(busy_params(cfg))
    micro = [batch(cfg, seed=3), batch(cfg, seed=4)]
    for _ in range(2):
        a.train_step(micro, 1.0, 0.9)
    b = make_backend(backend_name, cfg)
    b.load_params(a.params())
    b.load_optimizer_state(a.optimizer_state())
    a.train_step(micro, 0.8, 0.95)
    b.train_step(micro, 0.8, 0.95)
    pa, pb = a.params(), b.params()
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    sa, sb = a.optimizer_state(), b.optimizer_state()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


@pytest.mark.cuda
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.slow  # ~4 s
def test_compiled_step_equals_eager(backend_name):
    """Two compiled steps at two lrs give the eager steps' loss and weights (PyTorch: inductor's kernels;
    what compiles again, and what does not: test_torch_compiled_steady_state_has_no_recompiles)."""
    cfg = preset("smoke")
    micro = [batch(cfg, seed=5), batch(cfg, seed=6)]
    results = []
    with scalar_inductor_kernels(backend_name):
        for mode in ("off", "on"):
            backend = make_backend(backend_name, cfg.replace(compile=mode))
            backend.load_params(busy_params(cfg))
            for lr_mult in (1.0, 0.5):
                loss = float(backend.train_step(micro, lr_mult, 0.9))
            results.append((loss, backend.params()))
        (loss_eager, eager), (loss_compiled, compiled) = results
        assert loss_compiled == pytest.approx(loss_eager, rel=1e-5)
        # Fused kernels reorder fp32 sums; Newton-Schulz amplifies that to ~1e-5 after two steps.
        for k in eager:
            np.testing.assert_allclose(compiled[k], eager[k], rtol=0, atol=1e-4, err_msg=k)


def scalar_inductor_kernels(backend_name: str):
    """PyTorch: inductor's CPU kernels written without SIMD vectors. The same graphs, fusions and
    reordered sums, and a third less time in the C++ compiler, most of a cold compile here (a GPU's
    kernels are Triton's)."""
    if backend_name != "cuda":
        return contextlib.nullcontext()
    import torch._inductor.config

    return torch._inductor.config.patch({"cpp.vec_isa_ok": False})


@pytest.mark.slow  # compiles the step twice: minutes on 2 cores
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_compiled_loop_switch_equals_eager(backend_name):
    """Depth recurrence switched on mid-run takes effect under compile: the losses and weights of
    an eager run that switches at the same step, not those of a compiled run that never switches.
    In PyTorch, the switch then compiled the step once per layout, and the evaluation (one layout,
    then the other) compiles once per layout too: after that, neither layout (nor switching back)
    compiles anything. Graphs and guards are what is tested (PyTorch: `compile_backend="aot_eager"`,
    without inductor's code generation, whose numbers test_compiled_step_equals_eager checks)."""
    cfg = preset("smoke").replace(compile_backend="aot_eager", **SMALL_LOOPS_LANES)
    micro = [batch(cfg, seed=14), batch(cfg, seed=15)]
    fresh_compile_cache(backend_name)

    def train(mode: str, switch_at: int | None):
        backend = make_backend(backend_name, cfg.replace(compile=mode))
        backend.load_params(busy_params(cfg))
        backend.set_looping(False)
        losses = []
        for step in range(4):
            if step == switch_at:
                backend.set_looping(True)
            losses.append(float(backend.train_step(micro, 1.0, 0.9)))
        return losses, backend.params(), backend

    (eager_losses, eager, _), (losses, compiled, backend) = train("off", 2), train("on", 2)
    never_losses, never, _ = train("off", None)  # what a switch folded away at the trace would give
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    for k in eager:
        np.testing.assert_allclose(compiled[k], eager[k], rtol=0, atol=1e-4, err_msg=k)
    assert never_losses[:2] == pytest.approx(losses[:2], rel=1e-5)  # the same until the switch
    assert abs(never_losses[2] - losses[2]) > 1e-3 and abs(never_losses[3] - losses[3]) > 1e-3
    assert max(np.abs(never[k] - compiled[k]).max() for k in never) > 1e-3
    if backend_name != "cuda":
        return  # MLX: test_mlx_loop_switch_traces_each_layout_once
    import torch._dynamo

    x, y = batch(cfg, n=3, seed=18)
    for looping in (True, False):
        backend.set_looping(looping)
        backend.eval_nll(x, y)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for looping in (True, False, True):
            backend.set_looping(looping)
            backend.train_step(micro, 0.8, 0.95)
            backend.eval_nll(x, y)


@pytest.mark.mlx
@pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")
def test_mlx_sub_batches_equal_one_big_batch():
    cfg = preset("smoke").replace(mlx_max_microbatch_tokens=4096)
    micro = [batch(cfg, n=4, seed=7), batch(cfg, n=4, seed=8)]
    results = []
    for limit, eager in ((4096, False), (64, True), (128, False)):  # 1, 4 and 2 sub-batches per micro-batch
        backend = make_backend("mlx", cfg.replace(mlx_max_microbatch_tokens=limit, mlx_eager_eval=eager))
        backend.load_params(busy_params(cfg))
        loss = float(backend.train_step(micro, 1.0, 0.9))
        results.append((loss, backend.params()))
    for loss, params in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        # Adam's first step is ~lr * sign(g): embedding rows with near-zero gradients turn
        # summation-order noise into differences of up to ~1e-4 (0.2% of the lr).
        for k, v in params.items():
            np.testing.assert_allclose(v, results[0][1][k], rtol=0, atol=1e-4, err_msg=k)


@pytest.mark.mlx
@pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")
def test_mlx_step_compiles_once():
    import mlx.core as mx

    cfg = preset("smoke").replace(compile="on")
    backend = make_backend("mlx", cfg)
    backend.load_params(busy_params(cfg))
    traces = []
    original = backend.optim.apply

    def counting(*args, **kwargs):
        traces.append(1)  # runs only while mx.compile traces the update
        return original(*args, **kwargs)

    backend.optim.apply = counting
    micro = [batch(cfg, seed=9), batch(cfg, seed=10)]
    for i in range(4):
        backend.train_step(micro, 1.0 - 0.2 * i, 0.85 + 0.02 * i)
    mx.eval(backend.model.parameters())
    assert len(traces) == 1


@pytest.mark.slow  # ~45 s on 2 loaded cores
@pytest.mark.mlx
@pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")
def test_mlx_loop_switch_traces_each_layout_once():
    """The looping flag is a constant of the compiled step and evaluation: one trace per value."""
    cfg = preset("smoke").replace(compile="on", **SMALL_LOOPS_LANES)
    backend = make_backend("mlx", cfg)
    backend.load_params(busy_params(cfg))
    traces = []
    original = backend.model.hidden

    def counting(idx, looping=False, **kwargs):
        traces.append(looping)  # runs only while mx.compile traces the model
        return original(idx, looping, **kwargs)

    backend.model.hidden = counting
    micro = [batch(cfg, seed=16), batch(cfg, seed=17)]
    x, y = batch(cfg, seed=18)  # one sub-batch: one shape
    for looping in (False, False, True, True, False, True):
        backend.set_looping(looping)
        backend.train_step(micro, 1.0, 0.9)
        backend.eval_nll(x, y)
    assert traces == [False, False, True, True]  # gradient then evaluation, for each layout


@pytest.mark.mlx
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mlx_rms_norm_equals_torch_in_both_dtypes(dtype):
    torch = pytest.importorskip("torch", reason="torch is the reference for the RMSNorm convention")
    pytest.importorskip("mlx", reason="mlx not installed")
    import mlx.core as mx

    from mlx_train.model import rms_norm

    # Small activations make the epsilon matter: bf16's own epsilon (0.0078) would change them.
    x = (np.random.default_rng(0).normal(size=(4, 64)) * 0.01).astype(np.float32)
    expected = (
        torch.nn.functional.rms_norm(torch.from_numpy(x).to(getattr(torch, dtype)), (64,)).float().numpy()
    )
    got = np.array(rms_norm(mx.array(x).astype(getattr(mx, dtype))).astype(mx.float32))
    # fp32 may differ in the last bit (each framework's rsqrt); a wrong epsilon moves values by ~1e-3.
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)


@pytest.mark.cuda
@pytest.mark.slow  # torch.compile on a CPU: ~2 s each
@pytest.mark.torch
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_torch_compiled_steady_state_has_no_recompiles(compute_dtype):
    """fp32, and bf16 compute (autocast, as on CUDA): after one step, neither new lrs, new momenta and new
    steps nor validation batches of two sizes (as core.train.loop's spans give) compile anything again.
    One layer and aot_eager: dynamo's graphs and guards are what is tested (inductor's numbers:
    test_compiled_step_equals_eager)."""
    import torch._dynamo

    cfg = preset("smoke").replace(
        compile="on", compile_backend="aot_eager", compute_dtype=compute_dtype, num_layers=1
    )
    fresh_compile_cache("cuda")
    backend = make_backend("cuda", cfg)
    backend.load_params(busy_params(cfg))
    micro = [batch(cfg, seed=11), batch(cfg, seed=12)]
    backend.train_step(micro, 1.0, 0.85)
    x, y = batch(cfg, n=5, seed=13)

    def validate():  # a full batch, then a shorter last one, as core.train.loop's spans give
        return float(backend.eval_nll(x[:3], y[:3]) + backend.eval_nll(x[3:], y[3:]))

    first = validate()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(3):
            backend.train_step(micro, 0.9 - 0.2 * i, 0.9 + 0.02 * i)
        later = validate()
    assert later != first  # the steps did train


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_bf16_compute_stays_close_to_the_reference_and_learns(backend_name):
    """bf16 (autocast in torch, bf16 activations in MLX): round-off near 1e-2 on logits of size ~4."""
    cfg = preset("smoke").replace(num_layers=3, compute_dtype="bfloat16")
    backend = make_backend(backend_name, cfg)
    backend.load_params(busy_params(cfg))
    stored = backend.params()  # the embedding is held in bf16
    x, y = batch(cfg)
    error = np.abs(backend.logits(x) - reference_logits(stored, cfg, x)).max()
    assert backend.bf16 and 1e-4 < error < 0.06  # bf16 is really in use, and only its round-off shows
    first = float(backend.eval_nll(x, y)) / y.size
    assert first == pytest.approx(reference_loss(stored, cfg, x, y), rel=1e-3)
    for _ in range(30):  # memorise one batch
        last = float(backend.train_step([(x, y)], 1.0, 0.9))
    assert last < 0.1 * first


def test_backend_options_are_checked_by_their_backend():
    """A long sequence is no business of MLX's micro-batch option unless MLX runs."""
    from core.common.errors import PgolfError

    cfg = preset("smoke").replace(
        train_seq_len=16_384, train_batch_tokens=32_768, val_batch_size=32_768, mlx_max_microbatch_tokens=128
    )
    for info in backends.installed():
        memory.check_config(info.name, cfg)  # a sub-batch holds one whole sequence at least
    if backends.BACKENDS["mlx"].installed:
        with pytest.raises(PgolfError, match="mlx_max_microbatch_tokens must be positive"):
            memory.check_config("mlx", cfg.replace(mlx_max_microbatch_tokens=0))
    if backends.BACKENDS["cuda"].installed:
        memory.check_config("torch", cfg.replace(mlx_max_microbatch_tokens=0))  # not PyTorch's option


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_weight_decay_taper_scales_muons_decay_only(backend_name):
    """A step with Muon's weight decay times 0.3 (the taper) is the step of a config whose muon_wd is
    0.3 times as large; Adam's decay (embed_wd, adam_wd) is left as it is."""
    cfg = preset("smoke").replace(muon_wd=0.5, embed_wd=0.2, adam_wd=0.1)
    params, micro = busy_params(cfg), [batch(cfg)]
    tapered, plain = make_backend(backend_name, cfg), make_backend(backend_name, cfg.replace(muon_wd=0.15))
    for backend in (tapered, plain):
        backend.load_params(params)
    tapered.train_step(micro, 0.8, 0.9, 0.3)
    plain.train_step(micro, 0.8, 0.9)
    got, want = tapered.params(), plain.params()
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    untapered = make_backend(backend_name, cfg)
    untapered.load_params(params)
    untapered.train_step(micro, 0.8, 0.9)
    assert (
        np.abs(untapered.params()["blocks.0.attn.c_q.weight"] - got["blocks.0.attn.c_q.weight"]).max() > 1e-6
    )
