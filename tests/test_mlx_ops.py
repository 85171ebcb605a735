"""The CPU versions of the MLX model's heavy ops against the GPU ones (mlx_train/ops.py).

GPU_OPS is plain MLX (mx.fast attention, native matmuls, autodiff); CPU_OPS has
hand-written backward passes that recompute instead of keeping. In fp32 the two
must agree to round-off, values and gradients, including when the work is cut
into many blocks; in bf16 both must be equally close to the fp32 result.
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx not installed")
nn = pytest.importorskip("mlx.nn")
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from core.config.presets import preset  # noqa: E402
from core.model.params import round_to_bfloat16  # noqa: E402
from mlx_train import ops  # noqa: E402
from mlx_train.model import GPT  # noqa: E402
from tests.support.backends import batch, busy_params  # noqa: E402

pytestmark = pytest.mark.mlx


def rand(rng, *shape, scale=1.0):
    return mx.array((rng.normal(size=shape) * scale).astype(np.float32))


def values_and_grads(fn, args, cotangent):
    """fn(*args) and the gradient of <fn(*args), cotangent> with respect to every float arg."""
    floats = [i for i, a in enumerate(args) if a.dtype in (mx.float32, mx.bfloat16)]

    def inner(*xs):
        full = list(args)
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        return (fn(*full).astype(mx.float32) * cotangent).sum()

    grads = mx.grad(inner, argnums=list(range(len(floats))))(*[args[i] for i in floats])
    return fn(*args), grads


def assert_close(a, b, atol):
    np.testing.assert_allclose(
        np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), rtol=0, atol=atol
    )


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few hundred elements, so every shape below is cut into many pieces."""
    monkeypatch.setattr(ops, "BLOCK_ELEMENTS", 300)


@pytest.mark.parametrize(
    "b, heads, kv_heads, t, d",
    [(2, 4, 2, 17, 8), (1, 2, 2, 5, 4), (3, 6, 1, 33, 16), (1, 1, 1, 1, 4)],
)
@pytest.mark.parametrize("blocks", ["one", "many"])
def test_blocked_attention_equals_fused_attention(request, b, heads, kv_heads, t, d, blocks):
    if blocks == "many":
        request.getfixturevalue("small_blocks")
    rng = np.random.default_rng(t)
    q, k, v = rand(rng, b, heads, t, d), rand(rng, b, kv_heads, t, d), rand(rng, b, kv_heads, t, d)
    cot = rand(rng, b, heads, t, d)
    scale = 1.0 / np.sqrt(d)
    out_fused, g_fused = values_and_grads(lambda *a: ops.fused_attention(*a, scale), (q, k, v), cot)
    out_blocked, g_blocked = values_and_grads(lambda *a: ops.blocked_attention(*a, scale), (q, k, v), cot)
    assert_close(out_blocked, out_fused, 1e-5)
    for got, want in zip(g_blocked, g_fused, strict=True):
        assert_close(got, want, 1e-4)


@pytest.mark.parametrize("blocks", ["one", "many"])
def test_blocked_attention_with_segments_equals_fused_attention(request, blocks):
    """Document masking: query t sees keys lower[b, t]..t only, values and gradients alike."""
    if blocks == "many":
        request.getfixturevalue("small_blocks")
    rng = np.random.default_rng(7)
    b, heads, kv_heads, t, d = 2, 4, 2, 21, 8
    q, k, v = rand(rng, b, heads, t, d), rand(rng, b, kv_heads, t, d), rand(rng, b, kv_heads, t, d)
    starts = [[0, 3, 4, 12], [0, 8, 16]]  # segment starts of each row
    lower = np.zeros((b, t), dtype=np.int32)
    for row, cuts in enumerate(starts):
        for s in cuts:
            lower[row, s:] = s
    lower = mx.array(lower)
    cot = rand(rng, b, heads, t, d)
    scale = 1.0 / np.sqrt(d)
    out_fused, g_fused = values_and_grads(lambda *a: ops.fused_attention(*a, scale, lower), (q, k, v), cot)
    out_blocked, g_blocked = values_and_grads(
        lambda *a: ops.blocked_attention(*a, scale, lower), (q, k, v), cot
    )
    assert_close(out_blocked, out_fused, 1e-5)
    for got, want in zip(g_blocked, g_fused, strict=True):
        assert_close(got, want, 1e-4)
    plain = ops.blocked_attention(q, k, v, scale)
    assert_close(out_blocked[:1, :, :3], plain[:1, :, :3], 1e-6)  # the first segment sees what it saw
    assert float(mx.abs(out_blocked[:, :, 4:] - plain[:, :, 4:]).max()) > 1e-2


def test_blocked_attention_is_causal():
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 1, 2, 9, 4), rand(rng, 1, 1, 9, 4), rand(rng, 1, 1, 9, 4)
    before = ops.blocked_attention(q, k, v, 0.5)
    k2, v2 = mx.array(k), mx.array(v)
    k2[:, :, 6:] = 100.0
    v2[:, :, 6:] = -100.0
    after = ops.blocked_attention(q, k2, v2, 0.5)
    assert_close(after[:, :, :6], before[:, :, :6], 0)  # positions 0..5 never see keys 6..8
    assert float(mx.abs(after[:, :, 6:] - before[:, :, 6:]).max()) > 1.0


@pytest.mark.parametrize("blocks", ["one", "many"])
@pytest.mark.parametrize("shape", [(2, 13), (37,)])
def test_chunked_token_losses_equal_fused(request, blocks, shape):
    if blocks == "many":
        request.getfixturevalue("small_blocks")
    rng = np.random.default_rng(len(shape))
    vocab, d = 50, 12
    x, w = rand(rng, *shape, d), rand(rng, vocab, d, scale=2.0)  # large logits: the softcap matters
    targets = mx.array(rng.integers(0, vocab, shape).astype(np.int32))
    cot = rand(rng, *shape)
    args = (x, w, targets)
    out_fused, g_fused = values_and_grads(lambda *a: ops.fused_token_losses(*a, 5.0), args, cot)
    out_chunked, g_chunked = values_and_grads(lambda *a: ops.chunked_token_losses(*a, 5.0), args, cot)
    assert out_chunked.shape == tuple(shape) and out_chunked.dtype == mx.float32
    assert_close(out_chunked, out_fused, 1e-5)
    for got, want in zip(g_chunked, g_fused, strict=True):
        assert_close(got, want, 1e-5)


def test_blas_linear_in_bf16_is_a_bf16_matmul_with_fp32_sums():
    rng = np.random.default_rng(3)
    x = rand(rng, 2, 7, 24).astype(mx.bfloat16)
    w = rand(rng, 10, 24)  # fp32 weight: cast to bf16 at the matmul
    want = round_to_bfloat16(np.array(x.astype(mx.float32)) @ round_to_bfloat16(np.array(w)).T)
    got = ops.blas_linear(x, w)
    assert got.dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)), want)
    cot = rand(rng, 2, 7, 10)
    _, (gx_blas, gw_blas) = values_and_grads(ops.blas_linear, (x, w), cot)
    _, (gx_fused, gw_fused) = values_and_grads(ops.fused_linear, (x, w), cot)
    assert gx_blas.dtype == mx.bfloat16 and gw_blas.dtype == mx.float32
    assert_close(gx_blas, gx_fused, 0.05)  # bf16 rounding of values of size ~5
    assert_close(gw_blas, gw_fused, 0.05)


def model_loss_and_grads(cfg, params, ops_, dtype, compiled=False):
    model = GPT(cfg, dtype, ops_)
    model.update(
        tree_unflatten(
            [
                (k, mx.array(v).astype(dtype if k == "tok_emb.weight" else mx.float32))
                for k, v in params.items()
            ]
        )
    )
    fn = nn.value_and_grad(model, model.loss)
    if compiled:
        fn = mx.compile(fn, inputs=model.state, outputs=model.state)
    x, y = batch(cfg, n=3, seed=4)
    loss, grads = fn(mx.array(x), mx.array(y))
    return float(loss), {k: np.array(g.astype(mx.float32)) for k, g in tree_flatten(grads)}


@pytest.mark.parametrize(
    "tie", [pytest.param(True, marks=pytest.mark.slow), False]
)  # True: minutes on 2 cores
def test_model_with_cpu_ops_equals_model_with_gpu_ops_compiled(tie, small_blocks):
    cfg = preset("smoke").replace(tie_embeddings=tie)
    params = busy_params(cfg)
    loss_cpu, g_cpu = model_loss_and_grads(cfg, params, ops.CPU_OPS, mx.float32)
    loss_gpu, g_gpu = model_loss_and_grads(cfg, params, ops.GPU_OPS, mx.float32, compiled=True)
    assert loss_cpu == pytest.approx(loss_gpu, rel=1e-6)
    for k in g_gpu:
        np.testing.assert_allclose(g_cpu[k], g_gpu[k], rtol=0, atol=1e-5 * np.abs(g_gpu[k]).max(), err_msg=k)


def test_bf16_cpu_ops_are_as_close_to_fp32_as_gpu_ops():
    cfg = preset("smoke")
    params = {k: round_to_bfloat16(v) for k, v in busy_params(cfg).items()}
    loss32, g32 = model_loss_and_grads(cfg, params, ops.CPU_OPS, mx.float32)
    errors = {}
    for ops_ in (ops.CPU_OPS, ops.GPU_OPS):
        loss, grads = model_loss_and_grads(cfg, params, ops_, mx.bfloat16)
        rel = [np.linalg.norm(grads[k] - g32[k]) / np.linalg.norm(g32[k]) for k in g32]
        errors[ops_.name] = (abs(loss - loss32), float(np.median(rel)))
    loss_err, grad_err = errors["cpu"]
    assert 0 < loss_err < 1e-2 and 0 < grad_err < 0.05  # bf16 round-off: present, and small
    assert grad_err < 1.5 * errors["gpu"][1]
    assert loss_err < max(2 * errors["gpu"][0], 1e-3)
