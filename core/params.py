"""The canonical parameter layout of the v1 GPT, and its initialisation in numpy.

Both backends build their modules from these names and shapes and load the
arrays `init_params` returns, so one seed gives the same weights everywhere and
checkpoints exchange without a mapping table. The names are the upstream
scripts' state-dict keys (they are also the key set of the int8 artifact).
"""

from __future__ import annotations

import numpy as np

from core.config import Config
from core.errors import PgolfError

# Small per-channel tensors that steer the residual stream: trained with Adam at
# the scalar lr and kept in fp32 everywhere, including in the int8 artifact.
CONTROL_PATTERNS = (
    "attn_scale",
    "attn_scales",
    "mlp_scale",
    "mlp_scales",
    "resid_mix",
    "resid_mixes",
    "q_gain",
    "skip_weight",
    "skip_weights",
)

# Output projections start at zero, so every block starts as the identity.
ZERO_INIT_SUFFIXES = ("attn.proj.weight", "mlp.proj.weight", "lm_head.weight")


def is_control(name: str) -> bool:
    return any(pattern in name for pattern in CONTROL_PATTERNS)


def num_skip_weights(cfg: Config) -> int:
    encoder = cfg.num_layers // 2
    return min(encoder, cfg.num_layers - encoder)


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape (the embedding first, then the blocks in order; keys, not order, matter)."""
    d, kv_dim, hidden = cfg.model_dim, cfg.num_kv_heads * cfg.head_dim, cfg.mlp_mult * cfg.model_dim
    shapes: dict[str, tuple[int, ...]] = {
        "tok_emb.weight": (cfg.vocab_size, d),
        "skip_weights": (num_skip_weights(cfg), d),
    }
    for i in range(cfg.num_layers):
        b = f"blocks.{i}."
        shapes[b + "attn.c_q.weight"] = (d, d)
        shapes[b + "attn.c_k.weight"] = (kv_dim, d)
        shapes[b + "attn.c_v.weight"] = (kv_dim, d)
        shapes[b + "attn.proj.weight"] = (d, d)
        shapes[b + "attn.q_gain"] = (cfg.num_heads,)
        shapes[b + "mlp.fc.weight"] = (hidden, d)
        shapes[b + "mlp.proj.weight"] = (d, hidden)
        shapes[b + "attn_scale"] = (d,)
        shapes[b + "mlp_scale"] = (d,)
        shapes[b + "resid_mix"] = (2, d)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    return shapes


def param_group(name: str) -> str:
    """Which optimizer group a parameter belongs to: embed, head, matrix (Muon) or scalar."""
    if name == "tok_emb.weight":
        return "embed"
    if name == "lm_head.weight":
        return "head"
    if name.startswith("blocks.") and name.endswith(".weight") and not is_control(name):
        return "matrix"
    return "scalar"


def optimizer_state_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The canonical optimizer state of `core.backend`: a step counter, then Muon
    momentum for matrices and Adam moments for everything else, each shaped like its parameter."""
    shapes: dict[str, tuple[int, ...]] = {"step": ()}
    for name, shape in param_shapes(cfg).items():
        keys = ("momentum_buffer",) if param_group(name) == "matrix" else ("exp_avg", "exp_avg_sq")
        shapes.update({f"{key}/{name}": shape for key in keys})
    return shapes


def storage_dtypes(cfg: Config, bf16: bool) -> dict[str, str]:
    """The dtype each parameter is kept in by the model (recorded in the artifact).

    With bf16 compute the embedding lives in bf16 (as upstream); linear weights and
    control tensors stay fp32 and are cast at the matmul.
    """
    return {
        name: ("bfloat16" if bf16 and name == "tok_emb.weight" else "float32") for name in param_shapes(cfg)
    }


def round_to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 value (round half to even), returned as float32."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = ((bits + rounding) & np.uint32(0xFFFF0000)).astype(np.uint32)
    # NaN must stay NaN: adding the rounding bias could carry it into infinity.
    rounded = np.where(np.isnan(a), bits | np.uint32(0x00400000), rounded).astype(np.uint32)
    return rounded.view(np.float32).reshape(np.shape(a))


def init_params(cfg: Config, seed: int | None = None, bf16: bool = False) -> dict[str, np.ndarray]:
    """Fresh weights as float32 numpy arrays, the same for both backends.

    Distributions follow the upstream model: tied embedding N(0, tied_embed_init_std)
    (untied N(0, 1)), linear weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)) like
    nn.Linear, output projections zero, q_gain = qk_gain_init, scales and skip
    weights one, resid_mix = [1, 0].
    """
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(cfg).items():
        if name == "tok_emb.weight":
            std = cfg.tied_embed_init_std if cfg.tie_embeddings else 1.0
            value = rng.normal(0.0, std, size=shape)
        elif name.endswith(ZERO_INIT_SUFFIXES):
            value = np.zeros(shape)
        elif param_group(name) == "matrix":
            bound = 1.0 / np.sqrt(shape[1])
            value = rng.uniform(-bound, bound, size=shape)
        elif name.endswith("q_gain"):
            value = np.full(shape, cfg.qk_gain_init)
        elif name.endswith("resid_mix"):
            value = np.stack([np.ones(shape[1]), np.zeros(shape[1])])
        else:
            value = np.ones(shape)
        out[name] = value.astype(np.float32)
    if bf16:
        out["tok_emb.weight"] = round_to_bfloat16(out["tok_emb.weight"])
    return out


def count_params(cfg: Config) -> int:
    return sum(int(np.prod(s)) for s in param_shapes(cfg).values())


def flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward + backward) plus causal attention.

    The attention term is 6 * layers * dim * seq_len for a causal mask (half of the
    full 12 * L * d * T); the tied output head counts as a matmul.
    """
    matmul = sum(int(np.prod(s)) for n, s in param_shapes(cfg).items() if len(s) == 2 and not is_control(n))
    return 6.0 * matmul + 6.0 * cfg.num_layers * cfg.model_dim * cfg.train_seq_len


def config_for_params(cfg: Config, shapes: dict[str, tuple[int, ...]]) -> Config:
    """`cfg` with the model shape read off a set of weights (e.g. an upstream artifact).

    Everything the shapes determine is taken from them: vocabulary, width, depth,
    heads (q_gain has one entry per head), KV heads, MLP width and head tying.
    Other settings (softcap, RoPE base) stay as in `cfg`.
    """
    try:
        vocab, dim = shapes["tok_emb.weight"]
        layers = 1 + max(int(n.split(".")[1]) for n in shapes if n.startswith("blocks."))
        heads = shapes["blocks.0.attn.q_gain"][0]
        kv_heads = shapes["blocks.0.attn.c_k.weight"][0] // (dim // heads)
        mlp_mult = shapes["blocks.0.mlp.fc.weight"][0] // dim
    except (KeyError, ValueError, IndexError, ZeroDivisionError):
        raise PgolfError(
            "weights do not have the layout of the v1 GPT (missing or malformed tensors)"
        ) from None
    out = cfg.replace(
        vocab_size=vocab,
        model_dim=dim,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        mlp_mult=mlp_mult,
        tie_embeddings="lm_head.weight" not in shapes,
    )
    expected = param_shapes(out)
    if set(expected) != set(shapes) or any(tuple(shapes[n]) != s for n, s in expected.items()):
        extra = sorted(set(shapes) ^ set(expected))
        detail = f"unexpected or missing {extra[0]!r}" if extra else "a tensor has the wrong shape"
        raise PgolfError(f"weights do not match the v1 GPT layout: {detail}")
    return out
