"""The v1 GPT in PyTorch (the challenge's baseline), mirrored by mlx_train/model.py.

Features (SPEC section 4):
- token embedding -> RMSNorm -> x0; tied (or untied) output head with a tanh softcap;
- a U-Net of blocks: the first half push their outputs, the second half pop them
  in reverse and add them back scaled by `skip_weights`;
- each block mixes the residual with x0 (`resid_mix`), then adds scaled attention
  and relu^2-MLP outputs (`attn_scale`, `mlp_scale`);
- attention with separate q/k/v/proj, RMSNorm on q and k, RoPE, a per-head query
  gain, grouped-query causal SDPA.

Weights are created empty and filled by `load_params` from core.params.init_params,
so both backends start from the same numbers. Linear weights stay fp32 and are
cast to the compute dtype at the matmul; the embedding is bf16 in bf16 runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.config import Config
from core.params import num_skip_weights


def rms_norm(x: Tensor) -> Tensor:
    # eps=None: torch uses the fp32 machine epsilon (also for bf16 inputs); MLX copies that.
    return F.rms_norm(x, (x.size(-1),))


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of each head by -theta: [x1 cos + x2 sin, -x1 sin + x2 cos]."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class CastedLinear(nn.Linear):
    """Bias-free linear layer whose fp32 weight is cast to the input dtype at the matmul."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__(in_dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.c_q = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.c_k = CastedLinear(cfg.model_dim, kv_dim)
        self.c_v = CastedLinear(cfg.model_dim, kv_dim)
        self.proj = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.q_gain = nn.Parameter(torch.full((cfg.num_heads,), cfg.qk_gain_init))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, d = x.shape
        q = self.c_q(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        v = self.c_v(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = apply_rope(rms_norm(q), cos, sin) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rope(rms_norm(k), cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.num_kv_heads != self.num_heads
        )  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.fc = CastedLinear(cfg.model_dim, cfg.mlp_mult * cfg.model_dim)
        self.proj = CastedLinear(cfg.mlp_mult * cfg.model_dim, cfg.model_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(torch.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.model_dim
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)
        self.attn_scale = nn.Parameter(torch.ones(d))
        self.mlp_scale = nn.Parameter(torch.ones(d))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(d), torch.zeros(d))))

    def forward(self, x: Tensor, x0: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(x.dtype) * self.attn(rms_norm(x), cos, sin)
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.softcap = cfg.logit_softcap
        self.num_encoder = cfg.num_layers // 2
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.skip_weights = nn.Parameter(torch.ones(num_skip_weights(cfg), cfg.model_dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.lm_head = None if cfg.tie_embeddings else CastedLinear(cfg.model_dim, cfg.vocab_size)
        # RoPE tables for the training length; longer inputs recompute them.
        cos, sin = self._rope(cfg.train_seq_len, cfg.head_dim, cfg.rope_base)
        self.rope_base, self.head_dim = cfg.rope_base, cfg.head_dim
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @staticmethod
    def _rope(seq_len: int, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, D/2)
        return freqs.cos(), freqs.sin()

    def forward(self, idx: Tensor, targets: Tensor | None = None, reduction: str = "mean") -> Tensor:
        """Logits (B, T, V) when targets is None, else the cross-entropy (mean or sum)."""
        t = idx.size(1)
        if t <= self.rope_cos.size(0):
            cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        else:
            cos, sin = (r.to(idx.device) for r in self._rope(t, self.head_dim, self.rope_base))
        x = rms_norm(self.tok_emb(idx))  # (B, T, d)
        x0, skips = x, []
        for block in self.blocks[: self.num_encoder]:
            x = block(x, x0, cos, sin)
            skips.append(x)
        for i, block in enumerate(self.blocks[self.num_encoder :]):
            if skips:
                x = x + self.skip_weights[i].to(x.dtype) * skips.pop()
            x = block(x, x0, cos, sin)
        x = rms_norm(x)
        logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.tok_emb.weight.to(x.dtype))
        logits = self.softcap * torch.tanh(logits / self.softcap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)
