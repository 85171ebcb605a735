"""pgolf's GPT in PyTorch, mirrored block by block by mlx_train/model.py.

The challenge's baseline, and the records' features as config switches (all off
by default):
- token embedding -> RMSNorm -> x0; tied (or untied) output head with a tanh softcap;
- a U-Net of blocks: the first half push their outputs, the second half pop them
  in reverse and add them back scaled by `skip_weights` (or blended in through a
  sigmoid gate per channel, `skip_gates_enabled`);
- each block mixes the residual with x0 (`resid_mix`), then adds scaled attention
  and MLP outputs (`attn_scale`, `mlp_scale`); `ln_scale` scales the normed block
  inputs by 1/sqrt(layer + 1);
- attention: separate q/k/v/proj, RMSNorm on q and k, RoPE on all or the first
  `rope_dims` dimensions of each head, a per-head query gain, grouped-query causal
  SDPA; value embeddings (`ve_enabled`) added to v in `ve_layers`; XSA on the last
  `xsa_last_n` layers removes from each output its component along the token's own value;
- MLP: relu(x)^2 or leaky_relu(x, 0.5)^2, width int(mlp_mult * model_dim);
- depth recurrence (`num_loops`): once looping is switched on, layers
  loop_start..loop_end run 1 + num_loops times with shared weights; the U-Net
  halves are cut from that visit list (`Config.layer_layout`), and `looping` is
  an argument of the forward, so a compiled graph sees the switch;
- parallel residual lanes (`parallel_start_layer`): from the first decoder layer
  with that index on, attention reads lane 0 (mixed with x0) and the MLP lane 1,
  and each lane keeps `parallel_resid_lambdas` of itself plus
  `parallel_post_lambdas` of both outputs; the head reads their mean (or one lane).

Parameters are created with the names and shapes of core/model/params.py and filled by
`load_params` from its numpy initialisation, so both backends start from the
same numbers. Linear weights stay fp32 and are cast to the compute dtype at the
matmul; the embeddings are bf16 in bf16 runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.config.fields import Config
from core.model.params import mlp_hidden, num_skip_weights

Rope = tuple[Tensor, Tensor]  # cos, sin: (T, rope_dims / 2)
Lanes = tuple[Tensor, Tensor]  # the parallel residual lanes: 0 (attention reads it), 1 (the MLP's)


def rms_norm(x: Tensor) -> Tensor:
    # eps=None: torch uses the fp32 machine epsilon (also for bf16 inputs); MLX copies that.
    # Cast back: CUDA autocast (PyTorch >= 2.12) returns fp32 here, which would make the residual stream fp32.
    return F.rms_norm(x, (x.size(-1),)).to(x.dtype)


def rope_tables(seq_len: int, rope_dims: int, base: float) -> Rope:
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dims, 2, dtype=torch.float32) / rope_dims))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, R/2)
    return freqs.cos(), freqs.sin()


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate the two halves of the first R dims of each head by -theta: [x1 cos + x2 sin, -x1 sin + x2 cos]."""
    cos, sin = rope
    half = cos.size(-1)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin, rest), dim=-1)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, expand_kv: bool) -> Tensor:
    """Causal SDPA of q (B, H, T, D) over k, v (B, KV, T, D): query head h reads kv head h // (H / KV).

    `expand_kv` repeats each kv head for its query heads first: the same numbers, but in fp32 on CUDA
    a fused kernel runs instead of the math fallback `enable_gqa` takes, which holds (B, H, T, T) scores.
    """
    groups = q.size(1) // k.size(1)
    if expand_kv and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, T, D)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1))


def remove_self_value(y: Tensor, v: Tensor) -> Tensor:
    """XSA: y (B, H, T, D) minus its projection on the unit value vector of its own token (B, KV, T, D)."""
    b, h, t, d = y.shape
    kv = v.size(1)
    y = y.view(b, kv, h // kv, t, d)  # query head h = kv_head * G + g
    unit = F.normalize(v, dim=-1).unsqueeze(2)  # (B, KV, 1, T, D)
    return (y - (y * unit).sum(dim=-1, keepdim=True) * unit).view(b, h, t, d)


class CastedLinear(nn.Linear):
    """Bias-free linear layer whose fp32 weight is cast to the input dtype at the matmul."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__(in_dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.xsa = layer >= cfg.num_layers - cfg.xsa_last_n
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.c_q = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.c_k = CastedLinear(cfg.model_dim, kv_dim)
        self.c_v = CastedLinear(cfg.model_dim, kv_dim)
        self.proj = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.q_gain = nn.Parameter(torch.zeros(cfg.num_heads))

    def forward(self, x: Tensor, rope: Rope, v_embed: Tensor | None = None) -> Tensor:
        b, t, d = x.shape
        v = self.c_v(x)
        if v_embed is not None:
            v = v + v_embed
        q = self.c_q(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.c_k(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        rope = (rope[0].to(q.dtype), rope[1].to(q.dtype))
        q = apply_rope(rms_norm(q), rope) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rope(rms_norm(k), rope)
        y = causal_attention(q, k, v, expand_kv=q.is_cuda and q.dtype == torch.float32)  # (B, H, T, D)
        if self.xsa:
            y = remove_self_value(y, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def decode(self, x: Tensor, rope: Rope, start: int, kv: list[Tensor], v_embed: Tensor | None) -> Tensor:
        """This attention on tokens x (B, t, d) at positions start.., attending to the keys and values `kv`
        of the tokens before them (empty at first), to which theirs are appended."""
        b, t, d = x.shape
        v = self.c_v(x)
        if v_embed is not None:
            v = v + v_embed
        q = self.c_q(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.c_k(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        rope = (rope[0][start : start + t].to(q.dtype), rope[1][start : start + t].to(q.dtype))
        q = apply_rope(rms_norm(q), rope) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rope(rms_norm(k), rope)
        keys, values = (torch.cat((kv[0], k), 2), torch.cat((kv[1], v), 2)) if kv else (k, v)
        kv[:] = [keys, values]
        visible = (
            torch.arange(start + t, device=x.device)[None, :]
            <= torch.arange(start, start + t, device=x.device)[:, None]
        )
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=visible, enable_gqa=keys.size(1) != q.size(1)
        )
        if self.xsa:
            y = remove_self_value(y, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.negative_slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0
        self.fc = CastedLinear(cfg.model_dim, mlp_hidden(cfg))
        self.proj = CastedLinear(mlp_hidden(cfg), cfg.model_dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        h = F.leaky_relu(h, self.negative_slope) if self.negative_slope else torch.relu(h)
        return self.proj(h.square())


class Block(nn.Module):
    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        d = cfg.model_dim
        self.norm_scale = 1.0 / math.sqrt(layer + 1) if cfg.ln_scale else 1.0
        self.attn = CausalSelfAttention(cfg, layer)
        self.mlp = MLP(cfg)
        self.attn_scale = nn.Parameter(torch.zeros(d))
        self.mlp_scale = nn.Parameter(torch.zeros(d))
        self.resid_mix = nn.Parameter(torch.zeros(2, d))

    def norm(self, x: Tensor) -> Tensor:
        return rms_norm(x) * self.norm_scale if self.norm_scale != 1.0 else rms_norm(x)

    def mix(self, x: Tensor, x0: Tensor) -> Tensor:
        """The residual stream blended with the embedding x0 (`resid_mix`)."""
        mix = self.resid_mix.to(x.dtype)
        return mix[0] * x + mix[1] * x0

    def attn_branch(self, x: Tensor, rope: Rope, v_embed: Tensor | None = None) -> Tensor:
        return self.attn_scale.to(x.dtype) * self.attn(self.norm(x), rope, v_embed)

    def mlp_branch(self, x: Tensor) -> Tensor:
        return self.mlp_scale.to(x.dtype) * self.mlp(self.norm(x))

    def forward(self, x: Tensor, x0: Tensor, rope: Rope, v_embed: Tensor | None = None) -> Tensor:
        x = self.mix(x, x0)
        x = x + self.attn_branch(x, rope, v_embed)
        return x + self.mlp_branch(x)

    def forward_lanes(
        self, lanes: Lanes, x0: Tensor, rope: Rope, v_embed: Tensor | None, resid: Tensor, post: Tensor
    ) -> Lanes:
        """The same branches side by side: both read the incoming lanes, and lane j becomes
        resid[j] * lane_j + post[0, j] * attention + post[1, j] * MLP."""
        lane0, lane1 = lanes
        a = self.attn_branch(self.mix(lane0, x0), rope, v_embed)
        m = self.mlp_branch(lane1)
        resid, post = resid.to(a.dtype), post.to(a.dtype)
        return (
            resid[0] * lane0 + post[0, 0] * a + post[1, 0] * m,
            resid[1] * lane1 + post[0, 1] * a + post[1, 1] * m,
        )


class ValueEmbedding(nn.Module):
    """One token embedding shared by the value-embedding layers, projected to the kv width and scaled."""

    def __init__(self, cfg: Config):
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, cfg.ve_dim)
        self.proj = CastedLinear(cfg.ve_dim, kv_dim) if cfg.ve_dim != kv_dim else None
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, idx: Tensor) -> Tensor:
        h = self.embed(idx)  # (B, T, ve_dim)
        if self.proj is not None:
            h = self.proj(h)
        return h * self.scale.to(h.dtype)


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.softcap = cfg.logit_softcap
        self.layouts = {looping: cfg.layer_layout(looping) for looping in (False, True)}
        self.parallel_start = cfg.parallel_start_layer
        self.final_lane_choice = cfg.parallel_final_lane
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.skip_weights = nn.Parameter(torch.zeros(num_skip_weights(cfg), cfg.model_dim))
        self.skip_gates = (
            nn.Parameter(torch.zeros(num_skip_weights(cfg), cfg.model_dim))
            if cfg.skip_gates_enabled
            else None
        )
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.ve_layers = cfg.ve_layer_indices
        self.ve_shared = ValueEmbedding(cfg) if self.ve_layers else None
        self.ve_layer_scales = nn.ParameterList(nn.Parameter(torch.zeros(1)) for _ in self.ve_layers)
        self.lm_head = None if cfg.tie_embeddings else CastedLinear(cfg.model_dim, cfg.vocab_size)
        lanes = cfg.parallel_start_layer > 0
        self.parallel_post_lambdas = nn.Parameter(torch.zeros(cfg.num_layers, 2, 2)) if lanes else None
        self.parallel_resid_lambdas = nn.Parameter(torch.zeros(cfg.num_layers, 2)) if lanes else None
        # RoPE tables for the training length; longer inputs recompute them.
        self.rope_dims, self.rope_base = cfg.rope_dims or cfg.head_dim, cfg.rope_base
        cos, sin = rope_tables(cfg.train_seq_len, self.rope_dims, self.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope(self, t: int, device: torch.device) -> Rope:
        if t <= self.rope_cos.size(0):
            return self.rope_cos[:t], self.rope_sin[:t]
        cos, sin = rope_tables(t, self.rope_dims, self.rope_base)
        return cos.to(device), sin.to(device)

    def value_embeds(self, idx: Tensor) -> dict[int, Tensor]:
        """The value embedding each ve layer adds to its values (B, T, kv_dim)."""
        if self.ve_shared is None:
            return {}
        shared = self.ve_shared(idx)
        scales = zip(self.ve_layers, self.ve_layer_scales, strict=True)
        return {layer: shared * scale.to(shared.dtype) for layer, scale in scales}

    def skip(self, i: int, x: Tensor, skipped: Tensor) -> Tensor:
        """Decoder layer i takes back the encoder output `skipped`: added, or blended through a gate."""
        scaled = self.skip_weights[i].to(x.dtype) * skipped
        if self.skip_gates is None:
            return x + scaled
        return torch.lerp(scaled, x, torch.sigmoid(self.skip_gates[i].to(x.dtype)))

    def final_lane(self, lanes: Lanes) -> Tensor:
        """What the head reads of the two lanes."""
        if self.final_lane_choice == "attn":
            return lanes[0]
        if self.final_lane_choice == "mlp":
            return lanes[1]
        return 0.5 * (lanes[0] + lanes[1])

    def hidden(self, idx: Tensor, looping: bool = False) -> Tensor:
        """Token ids (B, T) -> the final normed hidden states (B, T, d)."""
        rope = self.rope(idx.size(1), idx.device)
        x = rms_norm(self.tok_emb(idx))  # (B, T, d)
        ve = self.value_embeds(idx)
        x0, skips = x, []
        encoder, decoder = self.layouts[looping]
        for i in encoder:
            x = self.blocks[i](x, x0, rope, ve.get(i))
            skips.append(x)
        lanes: Lanes | None = None
        for j, i in enumerate(decoder):
            if lanes is None and 0 < self.parallel_start <= i:
                lanes = (x, x)  # the split; Config.validate keeps every later layer parallel too
            if skips and j < self.skip_weights.size(0):
                if lanes is None:
                    x = self.skip(j, x, skips.pop())
                else:  # after the split the skips feed lane 0 only
                    lanes = (self.skip(j, lanes[0], skips.pop()), lanes[1])
            if lanes is None:
                x = self.blocks[i](x, x0, rope, ve.get(i))
            else:
                resid, post = self.parallel_resid_lambdas[i], self.parallel_post_lambdas[i]
                lanes = self.blocks[i].forward_lanes(lanes, x0, rope, ve.get(i), resid, post)
        if lanes is not None:
            x = self.final_lane(lanes)
        return rms_norm(x)

    def logits(self, idx: Tensor, looping: bool = False) -> Tensor:
        """Token ids (B, T) -> softcapped logits (B, T, V)."""
        x = self.hidden(idx, looping)
        z = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.tok_emb.weight.to(x.dtype))
        return self.softcap * torch.tanh(z / self.softcap)

    def token_losses(self, idx: Tensor, targets: Tensor, looping: bool = False) -> Tensor:
        """Cross-entropy in nats per token (B, T), computed in fp32."""
        logits = self.logits(idx, looping).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)

    def forward(self, idx: Tensor, targets: Tensor, reduction: str = "mean", looping: bool = False) -> Tensor:
        """The entry point that compile and DDP wrap: the cross-entropy, mean or sum.

        `looping` is an argument, not a module attribute, so torch.compile guards on it and
        keeps one graph per value (one recompile at the switch, none after it).
        """
        logits = self.logits(idx, looping).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)

    def decode(self, idx: Tensor, cache: KVCache, looping: bool = False) -> Tensor:
        """Softcapped logits (B, t, V) of tokens `idx` that follow those already in `cache` (empty at
        first), which keeps their keys and values for the next call."""
        start = cache.get("length", 0)
        rope = self.rope(start + idx.size(1), idx.device)
        originals = [block.attn for block in self.blocks]
        try:
            for i, block in enumerate(self.blocks):
                block.attn = CachedAttention(originals[i], rope, start, cache.setdefault(i, []))
            logits = self.logits(idx, looping)
        finally:
            for block, attn in zip(self.blocks, originals, strict=True):
                block.attn = attn
        cache["length"] = start + idx.size(1)
        return logits


# ------------------------------------------------------------------ generation
# Decoding with a KV cache: `GPT.decode` runs the usual forward pass (`logits`) on the new tokens only,
# with each attention module swapped for a `CachedAttention` that adds their keys and values to those
# kept from earlier calls. Everything but attention works token by token, so nothing else changes.
KVCache = dict  # {"length": tokens so far, layer: [[k, v] per visit of that layer in one forward]}


class CachedAttention(nn.Module):
    """Stands in for a block's attention during one `GPT.decode` call."""

    def __init__(self, attn: CausalSelfAttention, rope: Rope, start: int, visits: list[list[Tensor]]):
        super().__init__()
        self.attn, self.rope, self.start, self.visits, self.calls = attn, rope, start, visits, 0

    def forward(self, x: Tensor, rope: Rope, v_embed: Tensor | None = None) -> Tensor:
        if self.calls == len(self.visits):  # depth recurrence visits a layer more than once
            self.visits.append([])
        kv = self.visits[self.calls]
        self.calls += 1
        return self.attn.decode(x, self.rope, self.start, kv, v_embed)
