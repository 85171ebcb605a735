"""The model's forward pass, written once for every backend: what runs in which order.

A backend's model holds the parameters (with the names of core.model.params) in its
framework's modules, and subclasses `Walk` with the few operations its framework writes
its own way (listed in `Walk`'s docstring). Everything else here is
indexing, `reshape`, `swapaxes`, `+` and `*`, which torch and MLX arrays spell alike; the
flow depends only on the config and on Python ints and bools, so torch.compile traces it
into one graph and mx.compile into one trace per `looping` value.

The model (`model`, below) is a tree of modules holding:
- `tok_emb` (an embedding), `skip_weights`, `skip_gates` (with skip_gates_enabled);
- `smear_gate` (a linear layer, gate_window -> 1) and `smear_lambda` (with smear_gate_enabled);
- `blocks[i]`, each with `attn` (`c_q`, `c_k`, `c_v`, `proj`: linear layers; `q_gain`; the gate's
  `attn_gate_proj.weight` or `attn_gate_w` with an attention gate on),
  `mlp` (the MLP as one call), `attn_scale`, `mlp_scale`, `resid_mix`;
- `ve_shared` (`embed`, `proj` when ve_dim is not the kv width, `scale`) and
  `ve_layer_scales` (with ve_enabled);
- `parallel_resid_lambdas`, `parallel_post_lambdas` (with parallel_start_layer);
- `rope_table()`: the RoPE tables made by `rope_tables` for the training length, on the
  model's device.

What it computes:
- token embedding (SmearGate, `smear_gate_enabled`: plus lambda * sigmoid(W x_t[:gate_window]) times
  the token before's embedding, except where the token is a document's BOS) -> RMSNorm -> x0;
- a U-Net of blocks: the encoder's outputs are kept, and the decoder takes them back in
  reverse, added scaled by `skip_weights` (or blended in through a sigmoid gate per channel,
  `skip_gates_enabled`);
- each block mixes the residual with x0 (`resid_mix`), then adds scaled attention and MLP
  outputs (`attn_scale`, `mlp_scale`); `ln_scale` scales the normed block inputs by
  1/sqrt(layer + 1);
- attention: RMSNorm on q and k, RoPE on all or the first `rope_dims` dimensions of each
  head (rotating by -theta), a per-head query gain, grouped-query causal attention; the value
  embedding (`ve_enabled`) added to v in `ve_layers`; XSA on the last `xsa_last_n` layers
  removes from each output its component along the token's own value; then at most one per-head
  gate on the output (`attn_out_gate_enabled`, `gated_attn_enabled`, `sparse_attn_gate_enabled`);
- depth recurrence (`num_loops`): once looping is on, layers loop_start..loop_end run
  1 + num_loops times with shared weights; the U-Net halves are cut from that visit list
  (`Config.layer_layout`);
- parallel residual lanes (`parallel_start_layer`): from the first decoder layer with that
  index on, attention reads lane 0 (mixed with x0) and the MLP lane 1, and each lane keeps
  `parallel_resid_lambdas` of itself plus `parallel_post_lambdas` of both outputs; the head
  reads their mean (or one lane, `parallel_final_lane`);
- document-masked attention (`varlen_attn_enabled`): a token attends only to the tokens of its own
  segment of the row, which starts at the row's start, at each BOS (`bos_id`) and every
  `max_doc_len` tokens from a segment's start (`segment_starts`, `segments_every`); RoPE positions stay
  the row's;
- decoding with a KV cache (`cache`): the new tokens only, each visit of a block appending
  their keys and values to those it kept from the tokens before (and, with document masking, the
  start of the last document, so that a BOS among the new tokens ends what they may see).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

from core.config.features import uses_varlen_attention

if TYPE_CHECKING:  # names for annotations alone
    from collections.abc import Iterator
    from typing import Any

    from core.config.fields import Config

    Array = Any  # a torch tensor or an MLX array
    Rope = tuple[Array, Array]  # cos, sin: (T, rope_dims / 2)
    Lanes = tuple[Array, Array]  # the parallel residual lanes: 0 (attention reads it), 1 (the MLP's)
    # {"length": tokens so far, n: [keys, values] of the n-th block visit of one forward,
    #  "smear": the last token's embedding (with smear_gate_enabled),
    #  "doc": the position where the last token's document starts (B, 1) (with varlen_attn_enabled)}
    KVCache = dict
    # LoRA adapters of test-time training (core/model/lora.py): {name: (A, B)} over the whole model, and
    # one block visit's {target: (A, B)}
    Adapters = dict


class Walk:
    """The forward pass over a backend's modules. A subclass supplies the framework's operations:

    - `cast(a, like)`: `a` in the dtype (and on the device) of `like`;
    - `cat(arrays, axis)`, `sigmoid(a)`;
    - `rms_norm(x)`: RMSNorm over the last axis, epsilon the fp32 machine epsilon, in x's dtype;
    - `unit(v)`: v / max(|v|, 1e-12) over the last axis;
    - `arange(start, stop, step)`: float32 start, start + step, ... < stop;
    - `round_bf16(a)`: float32 `a` rounded to the nearest bfloat16 values (ties to even), kept in float32;
    - `embed(table, idx)`: the rows of the embedding module `table` for token ids idx, in the compute dtype;
    - `running_max(a)`: the running maximum of an integer array (B, T) along axis 1;
    - `attention(q, k, v, lower=None)`: causal attention of q (B, H, T, D) over k, v (B, KV, S, D), S >= T,
      scaled by 1/sqrt(D): query head h reads kv head h // (H / KV), and query t sits at position
      S - T + t. With `lower` (B, T), integers, query t of row b sees only keys lower[b, t] .. S - T + t
      (its segment).
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rope_dims = cfg.rope_dims or cfg.head_dim
        self.doc_mask = uses_varlen_attention(cfg)  # `plain_causal` turns it off for a while
        self.segment_len = cfg.max_doc_len  # `segments_every` changes it for a while

    # ------------------------------------------------------- document masking
    def segment_starts(self, idx: Array, start: int, cache: KVCache | None) -> Array:
        """For token ids (B, T) at positions start.. of their rows, the position where each one's segment
        starts: its document's (the last BOS at or before it, else the row's start, or the document
        the cache ended in), plus a whole number of `segment_len` (max_doc_len, unless `segments_every`
        says otherwise). The records cut their packed rows so."""
        size = self.segment_len
        pos = (idx * 0 + 1).cumsum(1) - 1 + start
        doc = pos * (idx == self.cfg.bos_id)
        known = None if cache is None else cache.get("doc")
        doc = self.running_max(doc) if known is None else self.running_max(self.cat([known, doc], 1))[:, 1:]
        if cache is not None:
            cache["doc"] = doc[:, -1:]
        return doc + (pos - doc) // size * size

    @contextmanager
    def plain_causal(self, active: bool) -> Iterator[None]:
        """While active, attention ignores document boundaries (test-time training's global phase
        with global_ttt_respect_doc_boundaries off)."""
        kept = self.doc_mask
        self.doc_mask = kept and not active
        try:
            yield
        finally:
            self.doc_mask = kept

    @contextmanager
    def segments_every(self, length: int) -> Iterator[None]:
        """While active, document masking cuts a document every `length` tokens from its start (record
        2026-04-27's evaluation cuts its flat batches every eval_seq_len, its training every train_seq_len).
        Compiled forwards: torch.compile guards the value (another graph); an mx.compile trace keeps the
        length it was made with, which changes nothing for a row no longer than either length (a cut
        every `length` tokens from a document's start then falls past the row's end)."""
        kept = self.segment_len
        self.segment_len = length
        try:
            yield
        finally:
            self.segment_len = kept

    # ------------------------------------------------------------------- RoPE
    def rope_tables(self, length: int) -> Rope:
        """cos and sin (length, R/2) in fp32 of the angles position * base^(-2i/R), for an input of `length`
        tokens: a function of the config and `length` alone. base is rope_base; with rope_yarn and an input
        longer than train_seq_len, rope_base * (length / train_seq_len)^(R / (R - 2)), which stretches the
        slowest frequency by length / train_seq_len (the records' ROPE_YARN, with the scale of a length).

        rope_precision rounds the tables at rope_base as a model held in bf16 computes them:
        bf16_inv_freq rounds the inverse frequencies (a bf16 model's buffer), bfloat16 also the
        positions (above 256 they fall on even numbers), the angles, cos and sin. Rescaled tables are
        computed afresh in fp32."""
        base, train_len = self.cfg.rope_base, self.cfg.train_seq_len
        precision = self.cfg.rope_precision
        if self.cfg.rope_yarn and length > train_len:
            base = base * (length / train_len) ** (self.rope_dims / (self.rope_dims - 2))
            precision = "float32"
        inv_freq = 1.0 / (base ** (self.arange(0, self.rope_dims, 2) / self.rope_dims))
        if precision != "float32":
            inv_freq = self.round_bf16(inv_freq)
        bf16 = self.round_bf16 if precision == "bfloat16" else (lambda a: a)  # rounds the rest, or not
        angles = bf16(bf16(self.arange(0, length, 1))[:, None] * inv_freq[None, :])
        return bf16(angles.cos()), bf16(angles.sin())

    def rope(self, model: Any, length: int) -> Rope:
        """`rope_tables(length)`: the model's own tables (made for the training length, where rope_yarn
        changes nothing) cut to `length`, or for a longer input new ones, not kept. Decoding with a cache
        asks for the length so far: past train_seq_len with rope_yarn, the new tokens rotate with that
        length's base while the kept keys keep the base they were rotated with."""
        cos, sin = model.rope_table()
        if length > cos.shape[0]:
            longer = self.rope_tables(length)
            cos, sin = self.cast(longer[0], cos), self.cast(longer[1], sin)
        return cos[:length], sin[:length]

    def apply_rope(self, x: Array, rope: Rope) -> Array:
        """Rotate the two halves of the first R dims of each head by -theta: [x1 cos + x2 sin, -x1 sin + x2 cos]."""
        cos, sin = rope
        half = cos.shape[-1]
        x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
        return self.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin, rest], -1)

    # -------------------------------------------------------------- attention
    def heads(self, y: Array, n: int) -> Array:
        """(B, T, n * D) -> (B, n, T, D)."""
        b, t, _ = y.shape
        return y.reshape(b, t, n, self.cfg.head_dim).swapaxes(1, 2)

    def remove_self_value(self, y: Array, v: Array) -> Array:
        """XSA: y (B, H, T, D) minus its projection on the unit value vector of its own token (B, KV, T, D)."""
        b, h, t, d = y.shape
        kv = v.shape[1]
        y = y.reshape(b, kv, h // kv, t, d)  # query head h = kv_head * G + g
        unit = self.unit(v)[:, :, None]  # (B, KV, 1, T, D)
        return (y - (y * unit).sum(-1, keepdims=True) * unit).reshape(b, h, t, d)

    def adapt(self, lora: Adapters | None, target: str, x: Array, y: Array) -> Array:
        """y, the output of a layer on x (B, T, in), plus its LoRA adapter's scale * (x A^T) B^T, if it has one."""
        if lora is None or target not in lora:
            return y
        a, b = lora[target]
        scale = self.cfg.ttt_lora_alpha / self.cfg.ttt_lora_rank  # of the TTT adapters (core/model/lora.py)
        return y + scale * ((x @ self.cast(a, x).swapaxes(1, 2)) @ self.cast(b, x).swapaxes(1, 2))

    def attend(
        self,
        i: int,
        attn: Any,
        x: Array,
        rope: Rope,
        v_embed: Array | None,
        kv: list | None,
        lora: Adapters | None = None,
        lower: Array | None = None,
    ) -> Array:
        """Layer i's attention on x (B, T, d). With `kv` (a block visit's cache, empty at first) the
        tokens attend to the keys and values kept there too, and theirs are appended; `lora` holds
        the visit's adapters; `lower` (B, T) the first key position each token sees (document masking)."""
        cfg = self.cfg
        b, t, d = x.shape
        v = self.adapt(lora, "v", x, attn.c_v(x))
        if v_embed is not None:
            v = v + v_embed
        q_raw = self.adapt(lora, "q", x, attn.c_q(x))
        q = self.heads(q_raw, cfg.num_heads)  # (B, H, T, D)
        k = self.heads(self.adapt(lora, "k", x, attn.c_k(x)), cfg.num_kv_heads)  # (B, KV, T, D)
        v = self.heads(v, cfg.num_kv_heads)
        rope = (self.cast(rope[0], q), self.cast(rope[1], q))
        q = self.apply_rope(self.rms_norm(q), rope) * self.cast(attn.q_gain, q)[None, :, None, None]
        k = self.apply_rope(self.rms_norm(k), rope)
        keys, values = k, v
        if kv is not None:
            if kv:
                keys, values = self.cat([kv[0], k], 2), self.cat([kv[1], v], 2)
            kv[:] = [keys, values]
        y = self.attention(q, keys, values, lower)  # (B, H, T, D)
        if i >= cfg.num_layers - cfg.xsa_last_n:
            y = self.remove_self_value(y, v)
        gate = self.attention_gate(attn, x, q_raw)
        if gate is not None:
            y = y * gate.swapaxes(1, 2)[..., None]
        return self.adapt(lora, "o", x, attn.proj(y.swapaxes(1, 2).reshape(b, t, d)))

    def attention_gate(self, attn: Any, x: Array, q_raw: Array) -> Array | None:
        """The per-head gate (B, T, H) on the attention output of tokens x (the attention's input), or
        None: the math (GATE_MATH, below) of the gate the config has on, over its weight."""
        gate = self.cfg.attention_gate()
        if gate is None:
            return None
        w = attn
        for part in gate.weight.split(".")[1:]:  # "attn.attn_gate_w": below the block's attention
            w = getattr(w, part)
        return GATE_MATH[gate.name](self, self.cast(w, x), x, q_raw)

    def attn_out_gate(self, w: Array, x: Array, q_raw: Array) -> Array:
        """AttnOutGate: 2 * sigmoid(W src[:gate_window]), src the attention's input or its raw queries."""
        src = q_raw if self.cfg.attn_out_gate_src == "q" else x
        return 2.0 * self.sigmoid(src[..., : self.cfg.gate_window] @ w.T)

    def gated_attention(self, w: Array, x: Array, q_raw: Array) -> Array:
        """Gated attention: sigmoid(W x)."""
        return self.sigmoid(x @ w.T)

    def sparse_attention_gate(self, w: Array, x: Array, q_raw: Array) -> Array:
        """The sparse gate: sigmoid(scale * W x[:gate_window])."""
        return self.sigmoid(self.cfg.sparse_attn_gate_scale * (x[..., : self.cfg.gate_window] @ w.T))

    # ----------------------------------------------------------------- blocks
    def norm(self, i: int, x: Array) -> Array:
        """RMSNorm of layer i's input; `ln_scale` scales it by 1/sqrt(i + 1) (layer 0's 1 is no multiply)."""
        normed = self.rms_norm(x)
        return normed * (1.0 / math.sqrt(i + 1)) if self.cfg.ln_scale and i > 0 else normed

    def mix(self, block: Any, x: Array, x0: Array) -> Array:
        """The residual stream blended with the embedding x0 (`resid_mix`)."""
        mix = self.cast(block.resid_mix, x)
        return mix[0] * x + mix[1] * x0

    def attn_branch(
        self,
        i: int,
        block: Any,
        x: Array,
        rope: Rope,
        v_embed: Array | None,
        kv: list | None,
        lora: Adapters | None = None,
        lower: Array | None = None,
    ) -> Array:
        attn = self.attend(i, block.attn, self.norm(i, x), rope, v_embed, kv, lora, lower)
        return self.cast(block.attn_scale, x) * attn

    def mlp_branch(self, i: int, block: Any, x: Array, lora: Adapters | None = None) -> Array:
        normed = self.norm(i, x)
        return self.cast(block.mlp_scale, x) * self.adapt(lora, "mlp", normed, block.mlp(normed))

    def block(
        self,
        model: Any,
        i: int,
        x: Array,
        x0: Array,
        rope: Rope,
        v_embed: Array | None,
        kv: list | None,
        lora: Adapters | None = None,
        lower: Array | None = None,
    ) -> Array:
        """Block i: mixed with x0, then the attention and the MLP branch, one after the other."""
        block = model.blocks[i]
        x = self.mix(block, x, x0)
        x = x + self.attn_branch(i, block, x, rope, v_embed, kv, lora, lower)
        return x + self.mlp_branch(i, block, x, lora)

    def parallel_block(
        self,
        model: Any,
        i: int,
        lanes: Lanes,
        x0: Array,
        rope: Rope,
        v_embed: Array | None,
        kv: list | None,
        lora: Adapters | None = None,
        lower: Array | None = None,
    ) -> Lanes:
        """Block i's branches side by side: both read the incoming lanes, and lane j becomes
        resid[j] * lane_j + post[0, j] * attention + post[1, j] * MLP."""
        block, (lane0, lane1) = model.blocks[i], lanes
        a = self.attn_branch(i, block, self.mix(block, lane0, x0), rope, v_embed, kv, lora, lower)
        m = self.mlp_branch(i, block, lane1, lora)
        resid = self.cast(model.parallel_resid_lambdas[i], a)
        post = self.cast(model.parallel_post_lambdas[i], a)
        return (
            resid[0] * lane0 + post[0, 0] * a + post[1, 0] * m,
            resid[1] * lane1 + post[0, 1] * a + post[1, 1] * m,
        )

    # ------------------------------------------------------------------ model
    def value_embeds(self, model: Any, idx: Array) -> dict[int, Array]:
        """The value embedding each ve layer adds to its values (B, T, kv_dim)."""
        layers = self.cfg.ve_layer_indices
        if not layers:
            return {}
        ve = model.ve_shared
        shared = self.embed(ve.embed, idx)  # (B, T, ve_dim)
        if self.cfg.ve_dim != self.cfg.num_kv_heads * self.cfg.head_dim:
            shared = ve.proj(shared)
        shared = shared * self.cast(ve.scale, shared)
        scales = zip(layers, model.ve_layer_scales, strict=True)
        return {layer: shared * self.cast(scale, shared) for layer, scale in scales}

    def smear(self, model: Any, x: Array, idx: Array, before: Array | None) -> Array:
        """SmearGate on the token embeddings x (B, T, d): x_t + lambda * sigmoid(W x_t[:gate_window]) * x_(t-1),
        where token t is not a BOS (a document start takes nothing from the document before). `before`
        is the embedding of the token before x's first one (decoding), else the first token is kept."""
        if before is None:
            first, x_t, x_prev, ids = x[:, :1], x[:, 1:], x[:, :-1], idx[:, 1:]
        else:
            first, x_t, x_prev, ids = None, x, self.cat([before, x[:, :-1]], 1), idx
        gate = self.cast(model.smear_lambda, x) * self.sigmoid(
            model.smear_gate(x_t[..., : self.cfg.gate_window])
        )
        not_bos = self.cast(ids != self.cfg.bos_id, x)[..., None]
        x_t = x_t + gate * x_prev * not_bos
        return x_t if first is None else self.cat([first, x_t], 1)

    def skip(self, model: Any, j: int, x: Array, skipped: Array) -> Array:
        """Decoder position j takes back the encoder output `skipped`: added, or blended through a gate."""
        scaled = self.cast(model.skip_weights[j], x) * skipped
        if not self.cfg.skip_gates_enabled:
            return x + scaled
        gate = self.sigmoid(self.cast(model.skip_gates[j], x))
        return scaled + gate * (x - scaled)  # lerp(scaled, x, gate)

    @staticmethod
    def visit_adapters(adapters: Adapters | None, n: int) -> Adapters | None:
        """Block visit n's adapters by target, from the model's {"<target>.<visit>": (A, B)}."""
        if adapters is None:
            return None
        return {name.split(".")[0]: pair for name, pair in adapters.items() if name.endswith(f".{n}")}

    def final_lane(self, lanes: Lanes) -> Array:
        """What the head reads of the two lanes."""
        if self.cfg.parallel_final_lane == "attn":
            return lanes[0]
        if self.cfg.parallel_final_lane == "mlp":
            return lanes[1]
        return 0.5 * (lanes[0] + lanes[1])

    def hidden(
        self,
        model: Any,
        idx: Array,
        looping: bool = False,
        cache: KVCache | None = None,
        adapters: Adapters | None = None,
    ) -> Array:
        """Token ids (B, T) -> the final normed hidden states (B, T, d). With `cache` (empty at first) the
        tokens follow those decoded before, whose keys and values it keeps; theirs are added. With
        `adapters` (core/model/lora.py, one row per sequence) each block visit adds its LoRA corrections."""
        start = 0 if cache is None else cache.get("length", 0)
        cos, sin = self.rope(model, start + idx.shape[1])
        rope = (cos[start:], sin[start:])
        x = self.embed(model.tok_emb, idx)  # (B, T, d)
        if self.cfg.smear_gate_enabled:
            before = None if cache is None else cache.get("smear")
            if cache is not None:
                cache["smear"] = x[:, -1:]  # the next call's token before
            x = self.smear(model, x, idx, before)
        x = self.rms_norm(x)
        lower = self.segment_starts(idx, start, cache) if self.doc_mask else None
        ve = self.value_embeds(model, idx)
        encoder, decoder = self.cfg.layer_layout(looping)
        x0, skips = x, []
        lanes: Lanes | None = None
        for n, i in enumerate(encoder + decoder):  # n: the block visit, i: its physical layer
            j = n - len(encoder)  # the position in the decoder (negative in the encoder)
            if j >= 0 and lanes is None and 0 < self.cfg.parallel_start_layer <= i:
                lanes = (x, x)  # the split; Config.validate keeps every later layer parallel too
            if j >= 0 and skips:  # the encoder, the shorter half, has no more outputs than skip weights
                if lanes is None:
                    x = self.skip(model, j, x, skips.pop())
                else:  # after the split the skips feed lane 0 only
                    lanes = (self.skip(model, j, lanes[0], skips.pop()), lanes[1])
            kv = None if cache is None else cache.setdefault(n, [])
            rest = (x0, rope, ve.get(i), kv, self.visit_adapters(adapters, n), lower)
            if lanes is None:
                x = self.block(model, i, x, *rest)
            else:
                lanes = self.parallel_block(model, i, lanes, *rest)
            if j < 0:
                skips.append(x)
        if lanes is not None:
            x = self.final_lane(lanes)
        if cache is not None:
            cache["length"] = start + idx.shape[1]
        return self.rms_norm(x)


# Each attention gate's math, by its name in core/config/fields.py's ATTENTION_GATES.
GATE_MATH = {
    "attn_out": Walk.attn_out_gate,
    "gated": Walk.gated_attention,
    "sparse": Walk.sparse_attention_gate,
}
