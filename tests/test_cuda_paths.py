"""The PyTorch backend's CUDA-only branches, run on the CPU: bf16 residual stream, kv expansion,
bf16 Newton-Schulz, and the MFU peak table; and, where a GPU is, the step and the varlen kernel on it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from core.config.presets import preset  # noqa: E402
from cuda_train import model as torch_model  # noqa: E402
from cuda_train.backend import peak_bf16_flops  # noqa: E402
from cuda_train.optim import orthogonaliser  # noqa: E402
from tests.support.backends import batch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.cuda]
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_block_output_stays_bf16_when_autocast_returns_fp32_norms(monkeypatch):
    """CUDA autocast (PyTorch >= 2.12) runs rms_norm in fp32 and returns fp32; the CPU's does not,
    so the norm is made to here. The residual stream must stay in the compute dtype regardless."""
    cfg = preset("smoke")
    model = torch_model.GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    fp32_norm = F.rms_norm
    monkeypatch.setattr(F, "rms_norm", lambda x, shape, *a, **k: fp32_norm(x.float(), shape, *a, **k))
    x = torch.randn(2, cfg.train_seq_len, cfg.model_dim, dtype=torch.bfloat16)
    rope = model.walk.rope(model, cfg.train_seq_len)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch_model.rms_norm(x).dtype == torch.bfloat16
        assert model.walk.block(model, 0, x, x, rope, None, None, None).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expanded_kv_heads_give_the_same_attention(dtype):
    """The repeat_interleave used on CUDA in fp32 equals SDPA's own grouped-query attention."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g).to(dtype)  # (B, H, T, D)
    k, v = (torch.randn(2, 2, 16, 8, generator=g).to(dtype) for _ in range(2))  # (B, KV, T, D)
    grouped = torch_model.causal_attention(q, k, v, expand_kv=False)
    expanded = torch_model.causal_attention(q, k, v, expand_kv=True)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(expanded, grouped, rtol=0, atol=tolerance)
    # Query head h reads kv head h // 2: head 3 attends like head 1 of a model whose kv head 0 is k[:, 1].
    single = F.scaled_dot_product_attention(q[:, 3:4], k[:, 1:2], v[:, 1:2], is_causal=True)
    torch.testing.assert_close(grouped[:, 3:4], single, rtol=0, atol=tolerance)


@pytest.mark.parametrize(("coefficients", "tolerance"), [("quintic", 0.05), ("polar_express", 0.08)])
def test_bf16_newton_schulz_stays_close_to_fp32(coefficients, tolerance):
    """The bf16 orthogonalisation that CUDA runs, here on CPU tensors, against fp32.

    Five iterations amplify bf16's round-off (2^-8) to 2.5-3.5% of the update with the quintic
    coefficients and 3-6.5% with Polar Express (measured over shapes and seeds); what Muon needs,
    the singular values held in the iteration's band, is the same in both dtypes.
    """
    cfg = preset("smoke").replace(muon_ns_coefficients=coefficients)
    for shape in [(64, 128), (128, 128), (256, 128)]:
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        fp32 = orthogonaliser(cfg, cuda=False, compile_on=False)(g)
        bf16 = orthogonaliser(cfg, cuda=True, compile_on=False)(g)
        assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
        error = float((bf16.float() - fp32).norm() / fp32.norm())
        assert 1e-3 < error < tolerance, (shape, error)  # bf16 is really in use, and only its round-off shows
        s32, s16 = torch.linalg.svdvals(fp32), torch.linalg.svdvals(bf16.float())
        assert float((s16 - s32).abs().max()) < 0.05, shape


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GH200 480GB", None),  # a substring match would have taken it for an H200
        ("NVIDIA GeForce RTX 4090", None),
        ("", None),  # the CPU
    ],
)
def test_mfu_peak_is_looked_up_by_the_exact_gpu_name(name, peak):
    assert peak_bf16_flops(name) == peak


@GPU
def test_a_bf16_step_on_the_gpu_learns_and_reports_its_memory():
    """On a GPU the backend picks it, computes in bf16 and reports the peak memory the bench prints."""
    from core.model.params import init_params
    from cuda_train.backend import create_backend

    cfg = preset("smoke").replace(compute_dtype="bfloat16")
    backend = create_backend(cfg)
    assert backend.torch_device.type == "cuda" and backend.bf16
    backend.load_params(init_params(cfg, bf16=True))
    micro = [batch(cfg, seed=1), batch(cfg, seed=2)]
    losses = [float(backend.train_step(micro, 1.0, 0.9)) for _ in range(4)]
    assert losses[-1] < losses[0], losses
    assert backend.peak_memory_bytes() > 0


@GPU
def test_the_flash_varlen_kernel_equals_the_masked_sdpa_it_replaces():
    """FlashAttention's varlen kernel, where installed, against the boolean-masked SDPA, in bf16."""
    from cuda_train import varlen

    if varlen.flash_varlen() is None:
        pytest.skip("FlashAttention (flash_attn_interface or flash_attn) is not installed")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, n, 48, 64, generator=g, device="cuda", dtype=torch.bfloat16) for n in (4, 2, 2))
    starts = torch.tensor(
        [[0] * 10 + [10] * 20 + [30] * 18, [0] * 48], device="cuda"
    )  # (B, T): segment starts
    got = varlen.varlen_attention(q, k, v, starts)
    want = torch_model.causal_attention(q, k, v, expand_kv=False, lower=starts)
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2e-2)
