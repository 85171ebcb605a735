"""Every parameter of the GPT, declared once: name, shape, initialisation, optimizer
group, storage dtype and artifact class.

`param_specs(cfg)` is the one table. Everything else is derived from it:
- the initial weights (`init_params`, numpy, so one seed gives the same weights in both backends);
- the optimizer groups: Muon or Adam, base learning rate and weight decay (`core.model.optim.GROUPS`);
- the canonical optimizer state and checkpoint layout (core/model/optim.py: `optimizer_state_shapes`);
- the dtype each parameter is kept in (`storage_dtypes`);
- the class the quantizer treats it as (`artifact_classes`);
- the memory a training run needs (core/model/memory.py).
(The reverse, a config read off a set of weights, is core/artifact/load.py's `config_for_params`.)

Each backend's model is built from the table by `make_modules` (its module tree, the names and shapes
of its parameters), and a test checks that each backend's model and this table cover each other exactly,
for every feature.
The names are the challenge scripts' state-dict keys (the key set of an artifact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from core.common.errors import PgolfError

if TYPE_CHECKING:  # names for annotations alone
    from core.config.fields import Config

KINDS = ("embedding", "attention", "mlp", "other", "control")  # artifact classes


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: what it is, how it starts, how it is trained, stored and quantized."""

    shape: tuple[int, ...]
    init: str  # normal (std = value) | uniform (+-1/sqrt(fan_in)) | const (= value) | resid_mix
    group: str  # optimizer group, a key of core.model.optim.GROUPS
    kind: str  # artifact class, one of KINDS; "control" tensors stay fp32 in every artifact
    value: float = 0.0  # the std of "normal", the fill of "const"
    low_precision: bool = False  # kept in the compute dtype (bf16 runs), not fp32


def _matrix(rows: int, cols: int, kind: str, zero: bool = False) -> ParamSpec:
    """A linear layer's weight (out, in), trained by Muon; output projections start at zero."""
    return ParamSpec((rows, cols), "const" if zero else "uniform", "matrix", kind)


def _control(shape: tuple[int, ...], value: float = 1.0, init: str = "const") -> ParamSpec:
    """A small tensor that steers the residual stream: Adam at the scalar lr, fp32 everywhere."""
    return ParamSpec(shape, init, "scalar", "control", value)


def _attention_gate(cfg: Config) -> dict[str, ParamSpec]:
    """The per-head gate on a layer's attention output, when one is on (its weight, heads x inputs);
    a gate of weight 0 is transparent (2 * sigmoid(0) = 1, AttnOutGate) or halves the output."""
    gate = cfg.attention_gate()
    if gate is None:
        return {}
    inputs = cfg.gate_window if gate.windowed else cfg.model_dim
    std = getattr(cfg, gate.init_std) if gate.init_std else 0.0  # never negative (its check)
    return {gate.weight: _control((cfg.num_heads, inputs), std, "normal" if std > 0 else "const")}


def num_skip_weights(cfg: Config) -> int:
    """U-Net skip connections: as many as the shorter half, of the looped layout when there is one
    (with looping off the decoder then uses only the first num_layers // 2)."""
    encoder, decoder = cfg.layer_layout(looping=cfg.num_loops > 0)
    return min(len(encoder), len(decoder))


def mlp_hidden(cfg: Config) -> int:
    """MLP width: mlp_mult * model_dim, rounded down (mlp_mult may be fractional)."""
    return int(cfg.mlp_mult * cfg.model_dim)


def head_weight_name(cfg: Config) -> str:
    """The weight the output head multiplies the final hidden state by."""
    return "tok_emb.weight" if cfg.tie_embeddings else "lm_head.weight"


def param_specs(cfg: Config) -> dict[str, ParamSpec]:
    """The table: every parameter the configured model has, in a fixed order (the init draw order)."""
    d, kv_dim, hidden = cfg.model_dim, cfg.num_kv_heads * cfg.head_dim, mlp_hidden(cfg)
    emb_std = cfg.tied_embed_init_std if cfg.tie_embeddings else 1.0
    specs: dict[str, ParamSpec] = {
        "tok_emb.weight": ParamSpec((cfg.vocab_size, d), "normal", "embed", "embedding", emb_std, True),
        "skip_weights": _control((num_skip_weights(cfg), d)),
    }
    if cfg.skip_gates_enabled:  # sigmoid(0) = 1/2: each skip starts half blended in
        specs["skip_gates"] = _control((num_skip_weights(cfg), d), 0.0)
    if cfg.smear_gate_enabled:  # lambda = 0: no smear at the start
        specs["smear_gate.weight"] = _control((1, cfg.gate_window), 0.0)
        specs["smear_lambda"] = _control((1,), 0.0)
    for i in range(cfg.num_layers):
        b = f"blocks.{i}."
        specs[b + "attn.c_q.weight"] = _matrix(d, d, "attention")
        specs[b + "attn.c_k.weight"] = _matrix(kv_dim, d, "attention")
        specs[b + "attn.c_v.weight"] = _matrix(kv_dim, d, "attention")
        specs[b + "attn.proj.weight"] = _matrix(d, d, "attention", zero=True)
        specs[b + "attn.q_gain"] = _control((cfg.num_heads,), cfg.qk_gain_init)
        specs.update({b + name: spec for name, spec in _attention_gate(cfg).items()})
        specs[b + "mlp.fc.weight"] = _matrix(hidden, d, "mlp")
        specs[b + "mlp.proj.weight"] = _matrix(d, hidden, "mlp", zero=True)
        specs[b + "attn_scale"] = _control((d,))
        specs[b + "mlp_scale"] = _control((d,))
        specs[b + "resid_mix"] = _control((2, d), init="resid_mix")
    if cfg.ve_enabled:
        # One shared value embedding, its scale, and a scale per receiving layer. Its classes follow
        # the records' quantizer: the table is "other" (int8 there), the projection "attention".
        specs["ve_shared.embed.weight"] = ParamSpec(
            (cfg.vocab_size, cfg.ve_dim), "normal", "embed", "other", 0.01, True
        )
        if cfg.ve_dim != kv_dim:
            specs["ve_shared.proj.weight"] = _matrix(kv_dim, cfg.ve_dim, "attention", zero=True)
        specs["ve_shared.scale"] = _control((), 0.1)
        for j in range(len(cfg.ve_layer_indices)):
            specs[f"ve_layer_scales.{j}"] = _control((1,))
    if not cfg.tie_embeddings:
        specs["lm_head.weight"] = ParamSpec((cfg.vocab_size, d), "const", "head", "embedding")
    if cfg.parallel_start_layer > 0:
        # Per physical layer: [i, sublayer (0 attention, 1 MLP), lane] writes and [i, lane] residual keeps.
        specs["parallel_post_lambdas"] = _control((cfg.num_layers, 2, 2))
        specs["parallel_resid_lambdas"] = _control((cfg.num_layers, 2), 1.1)
    return specs


class ModuleParts(Protocol):
    """What a backend supplies `make_modules`: its modules, layers and parameters, made empty."""

    def container(self, name: str | None) -> Any:
        """The module a name's path goes through: `name` (None for a block of `blocks`), a list for `blocks`
        and `ve_layer_scales`, the MLP for `mlp` (the walk calls it), else a plain module."""

    def linear(self, in_dim: int, out_dim: int) -> Any: ...

    def embedding(self, rows: int, cols: int) -> Any: ...

    def parameter(self, shape: tuple[int, ...]) -> Any: ...


def make_modules(cfg: Config, root: Any, parts: ModuleParts) -> None:
    """`root`'s module tree made from the table, in its order, by its names: the modules each name's path
    goes through (`parts.container`, made where the table first names them; a numbered part is a list's
    next item), then its leaf: a `<layer>.weight` is a linear layer (`parts.linear`, `rows x cols` weight
    of an `in -> out` map), or an embedding for `tok_emb` and the value embedding's `embed`; every other
    entry a parameter (`parts.parameter`, zeros until the weights are loaded)."""
    for name, spec in param_specs(cfg).items():
        *path, leaf = name.removesuffix(".weight").split(".")
        owner = root
        for part in path:
            if part.isdigit():  # blocks.<i>
                if int(part) == len(owner):
                    owner.append(parts.container(None))
                owner = owner[int(part)]
            else:
                if not hasattr(owner, part):
                    setattr(owner, part, parts.container(part))
                owner = getattr(owner, part)
        if name.endswith(".weight"):
            rows, cols = spec.shape
            value = parts.embedding(rows, cols) if leaf in ("tok_emb", "embed") else parts.linear(cols, rows)
        else:
            value = parts.parameter(spec.shape)
        if leaf.isdigit():  # ve_layer_scales.<j>
            owner.append(value)
        else:
            setattr(owner, leaf, value)


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    return {name: spec.shape for name, spec in param_specs(cfg).items()}


def storage_dtypes(cfg: Config, bf16: bool) -> dict[str, str]:
    """The dtype each parameter is kept in by the model (recorded in the artifact).

    With bf16 compute the embeddings live in bf16 (as upstream); linear weights and
    control tensors stay fp32 and are cast at the matmul.
    """
    return {
        name: "bfloat16" if bf16 and spec.low_precision else "float32"
        for name, spec in param_specs(cfg).items()
    }


def artifact_classes(cfg: Config) -> dict[str, str]:
    """The class of each parameter for the quantizer (one of KINDS)."""
    return {name: spec.kind for name, spec in param_specs(cfg).items()}


def round_to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 value (round half to even), returned as float32."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = ((bits + rounding) & np.uint32(0xFFFF0000)).astype(np.uint32)
    # NaN must stay NaN: adding the rounding bias could carry it into infinity.
    rounded = np.where(np.isnan(a), bits | np.uint32(0x00400000), rounded).astype(np.uint32)
    return rounded.view(np.float32).reshape(np.shape(a))


def _initial_value(spec: ParamSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.init == "normal":
        return rng.normal(0.0, spec.value, size=spec.shape)
    if spec.init == "uniform":  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1.0 / np.sqrt(spec.shape[1])
        return rng.uniform(-bound, bound, size=spec.shape)
    if spec.init == "const":
        return np.full(spec.shape, spec.value)
    # resid_mix, the last rule of ParamSpec.init: [1, 0], the block starts from the residual alone
    return np.stack([np.ones(spec.shape[1]), np.zeros(spec.shape[1])])


def init_params(cfg: Config, seed: int | None = None, bf16: bool = False) -> dict[str, np.ndarray]:
    """Fresh weights as float32 numpy arrays, the same for both backends.

    Random tensors are drawn from one generator in the table's order; with bf16
    compute the low-precision ones are rounded to bf16 values.
    """
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    out: dict[str, np.ndarray] = {}
    for name, spec in param_specs(cfg).items():
        value = _initial_value(spec, rng).astype(np.float32)
        out[name] = round_to_bfloat16(value) if bf16 and spec.low_precision else value
    return out


def count_params(cfg: Config) -> int:
    # math.prod of Python ints: no overflow, however absurd the config
    return sum(math.prod(spec.shape) for spec in param_specs(cfg).values())


def flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward + backward) plus causal attention.

    The attention term is 6 * layers * dim * seq_len for a causal mask (half of the
    full 12 * L * d * T); the tied output head counts as a matmul.
    """
    matmul = sum(
        math.prod(s.shape) for s in param_specs(cfg).values() if len(s.shape) == 2 and s.kind != "control"
    )
    return 6.0 * matmul + 6.0 * cfg.num_layers * cfg.model_dim * cfg.train_seq_len


def check_layout(cfg: Config, shapes: dict[str, tuple[int, ...]], what: str) -> None:
    """Refuse tensors that are not exactly the configured model's parameters, naming the first mismatch."""
    expected = param_shapes(cfg)
    extra = sorted(set(shapes) - set(expected))
    missing = [n for n in expected if n not in shapes]
    if extra or missing:
        problem = f"unexpected tensor {extra[0]!r}" if extra else f"missing tensor {missing[0]!r}"
        raise PgolfError(f"{what}: {problem} for this model config")
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise PgolfError(f"{what}: {name} is shape {tuple(shapes[name])}, but the config expects {shape}")
