"""The one training configuration, shared by both backends.

Field names are the upstream scripts' hyperparameter names in lower case, so the
upstream environment variables (`ITERATIONS`, `MATRIX_LR`, ...) map onto them
by upper-casing. Sources are layered: preset < TOML file < environment < flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from core.common.compress import COMPRESSORS
from core.common.errors import PgolfError, did_you_mean
from core.data.shards import MAX_VOCAB, TRAIN_LOADERS

# Upstream spellings that are not simply FIELD.upper().
ENV_ALIASES = {"TRAIN_MAX_SEQ_LEN": "train_seq_len"}

SEED_MAX = 2**32 - 1  # seeds in 0..SEED_MAX: a range numpy, torch and MLX all accept
# Far deeper than any model the 16 MB budget allows; it bounds the parameter table (and what an
# artifact's tensor names may declare) before anything is built from it.
MAX_LAYERS = 1024
MAX_CONFIG_BYTES = 2**20  # a TOML file of every field is a few KB


# Range rules of the numeric fields, checked by Config.validate.
POSITIVE_FIELDS = (
    "vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "train_seq_len",
    "train_batch_tokens", "grad_accum_steps", "val_batch_size", "logit_softcap", "rope_base", "adam_eps",
    "mlp_mult", "ve_dim", "eval_batch_seqs",
)  # fmt: skip
NON_NEGATIVE_FIELDS = (
    "iterations", "warmup_steps", "warmdown_iters", "val_loss_every", "val_max_tokens", "train_log_every",
    "checkpoint_every", "muon_backend_steps", "max_wallclock_seconds", "embed_lr", "head_lr", "tied_embed_lr",
    "matrix_lr", "scalar_lr", "tied_embed_init_std", "grad_clip_norm", "rope_dims", "xsa_last_n", "muon_wd",
    "embed_wd", "adam_wd", "collective_timeout_seconds", "num_loops", "loop_start", "loop_end",
    "parallel_start_layer", "eval_seq_len", "eval_stride", "byte_shuffle", "gptq_calibration_batches",
    "gptq_reserve_seconds", "embed_clip_sigmas", "matrix_clip_sigmas", "attn_clip_sigmas", "mlp_clip_sigmas",
    "checkpoint_minutes",
)  # fmt: skip
FRACTION_FIELDS = ("muon_momentum", "muon_momentum_warmup_start", "beta1", "beta2", "ema_decay")
UNIT_FIELDS = ("warmdown_frac", "min_lr", "enable_looping_at")  # in [0, 1]
# What a resumed run may set differently from its checkpoint: how long, how often it reports and
# checkpoints, and how it executes; not what it computes.
RESUMABLE_FIELDS = (
    "iterations", "max_wallclock_seconds", "val_loss_every", "val_max_tokens", "val_batch_size",
    "train_log_every", "checkpoint_every", "checkpoint_minutes", "report_to", "run_id", "out_dir",
    "compile", "collective_timeout_seconds", "mlx_max_microbatch_tokens", "mlx_eager_eval",
)  # fmt: skip
# Presets made for the challenge's FineWeb data (a warning when they run on the embedded corpus).
CHALLENGE_DATA_PRESETS = ("baseline", "seq4096", "record_0401")
CHOICES = {
    "compute_dtype": ("auto", "bfloat16", "float32"),
    "compile": ("auto", "on", "off"),
    "mlp_activation": ("relu2", "leaky_relu2"),
    "muon_ns_coefficients": ("quintic", "polar_express"),
    "train_loader": tuple(TRAIN_LOADERS),
    "parallel_final_lane": ("mean", "mlp", "attn"),
    "quant_format": ("int8", "mixed"),
    "compressor": tuple(COMPRESSORS),
}
# The mixed format's bits per class: int-N with per-row scales, or 16 = kept in fp16.
QUANT_BITS = (5, 6, 7, 8, 16)
BITS_FIELDS = ("embed_bits", "matrix_bits", "attn_bits", "mlp_bits", "other_bits")


def opt(default: Any, help: str) -> Any:
    """A Config field with its one-line meaning (the --flag help)."""
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # --- data ---
    dataset: str = opt(
        "",
        "a dataset of data/manifest.json by name (e.g. fineweb10B_sp1024): sets data_path, tokenizer_path "
        "and vocab_size; empty = data_path's folder",
    )
    data_path: str = opt("data/datasets/sotu_sp1024", "folder holding fineweb_{train,val}_*.bin shards")
    train_loader: str = opt(
        "sequential",
        "sequential (shards in order, upstream's stream) | coprime (the 03-29..04-04 records' "
        "coprime-stride multi-shard sampler, seeded by the shard names)",
    )
    tokenizer_path: str = opt("data/tokenizers/sotu_1024_bpe.model", "SentencePiece model used for BPB")
    run_id: str = opt("", "name of the run directory under out_dir; empty = timestamp")
    run_group: str = opt(
        "", "the experiment a run belongs to (train --seeds names it): runs groups them, --compare tests them"
    )
    out_dir: str = opt("runs", "where run directories are created")
    seed: int = opt(1337, "seeds the numpy initialisation (identical weights in both backends); 0..2^32-1")

    # --- training length and batch ---
    iterations: int = opt(20_000, "optimizer steps (the wallclock cap may stop earlier)")
    train_batch_tokens: int = opt(524_288, "tokens per optimizer step, summed over ranks and micro-batches")
    train_seq_len: int = opt(1024, "tokens per training sequence")
    grad_accum_steps: int = opt(8, "micro-batches per step on one process, split evenly over W ranks")
    max_wallclock_seconds: float = opt(600.0, "training-time cap (validation excluded); 0 = none")
    warmup_steps: int = opt(20, "compile-warmup steps, run for real then undone")
    warmdown_iters: int = opt(1200, "steps of the final linear LR decay (step-times under a wallclock cap)")
    warmdown_frac: float = opt(
        0.0, "if > 0: the last fraction of the run (steps, or the wallclock cap) decays the LR instead"
    )
    min_lr: float = opt(0.0, "floor of the LR multiplier during the warmdown")

    # --- validation and logging ---
    val_loss_every: int = opt(1000, "validate every N steps (and always at the end); 0 = only at the end")
    val_batch_size: int = opt(
        524_288, "validation tokens per forward pass x grad_accum_steps (each pass holds 1/grad_accum_steps)"
    )
    val_max_tokens: int = opt(0, "cap on validation tokens for quick looks; 0 = the whole split")
    train_log_every: int = opt(200, "log train loss every N steps (and the first 10)")
    checkpoint_every: int = opt(0, "write a resumable checkpoint every N steps; 0 = only at the end")
    eval_seq_len: int = opt(0, "tokens per evaluation sequence or window; 0 = train_seq_len")
    eval_stride: int = opt(
        0,
        "sliding-window evaluation: each window of eval_seq_len advances by, and scores, this many "
        "tokens (the first scores all); 0 = non-overlapping sequences",
    )
    eval_batch_seqs: int = opt(32, "sliding windows per forward pass on each rank")
    checkpoint_minutes: float = opt(
        10.0, "also write one every N minutes of training time, replacing the last timed one; 0 = off"
    )
    report_to: str = opt(
        "",
        "also send the metrics to: tensorboard, wandb, trackio (comma-separated); empty = only metrics.jsonl",
    )

    # --- model shape ---
    vocab_size: int = opt(1024, "must equal the tokenizer's vocabulary")
    num_layers: int = opt(9, "transformer blocks (first half encoder, second half decoder of the U-Net)")
    model_dim: int = opt(512, "residual width")
    num_heads: int = opt(8, "query heads")
    num_kv_heads: int = opt(4, "key/value heads (grouped-query attention)")
    mlp_mult: float = opt(2.0, "MLP hidden width = int(mlp_mult * model_dim)")
    mlp_activation: str = opt("relu2", "relu2 (relu(x)^2) | leaky_relu2 (leaky_relu(x, 0.5)^2)")
    tie_embeddings: bool = opt(True, "share the token embedding with the output head")
    rope_base: float = opt(10_000.0, "RoPE frequency base")
    logit_softcap: float = opt(30.0, "logits = c * tanh(z / c)")
    qk_gain_init: float = opt(1.5, "initial per-head query gain")
    rope_dims: int = opt(0, "rotate only the first rope_dims dimensions of each head (partial RoPE); 0 = all")
    ln_scale: bool = opt(False, "scale each block's normed inputs by 1/sqrt(layer + 1)")
    xsa_last_n: int = opt(
        0, "XSA on the last N layers: remove each token's own value direction from attention's output"
    )
    ve_enabled: bool = opt(
        False, "value embeddings: a shared token embedding added to the values of ve_layers"
    )
    ve_dim: int = opt(128, "width of the value embedding (projected to the kv width when different)")
    ve_layers: str = opt("9,10", "comma-separated layers that receive the value embedding")
    skip_gates_enabled: bool = opt(False, "U-Net skips blended in through a sigmoid gate per channel")
    num_loops: int = opt(
        0,
        "depth recurrence: once looping is on, layers loop_start..loop_end run 1 + num_loops times; 0 = off",
    )
    loop_start: int = opt(3, "first layer of the looped segment")
    loop_end: int = opt(5, "last layer of the looped segment (inclusive)")
    enable_looping_at: float = opt(
        0.35, "looping turns on at this fraction of training (steps, or the wallclock cap), for good"
    )
    parallel_start_layer: int = opt(
        0, "parallel residual lanes (attention and MLP side by side) from decoder layer N on; 0 = off"
    )
    parallel_final_lane: str = opt(
        "mean", "the lanes' output to the head: mean | mlp (lane 1) | attn (lane 0)"
    )
    tied_embed_init_std: float = opt(0.005, "std of the (tied) embedding init")

    # --- optimizers ---
    embed_lr: float = opt(0.6, "Adam lr of the embedding when untied")
    head_lr: float = opt(0.008, "Adam lr of the untied output head")
    tied_embed_lr: float = opt(0.05, "Adam lr of the tied embedding")
    matrix_lr: float = opt(0.04, "Muon lr of the 2-D block matrices")
    scalar_lr: float = opt(0.04, "Adam lr of vectors, scalars, control tensors and skip weights")
    muon_momentum: float = opt(0.95, "Muon momentum after warmup")
    muon_backend_steps: int = opt(5, "Newton-Schulz iterations")
    muon_momentum_warmup_start: float = opt(0.85, "Muon momentum at step 0")
    muon_momentum_warmup_steps: int = opt(500, "steps of the linear momentum warmup")
    beta1: float = opt(0.9, "Adam beta1")
    beta2: float = opt(0.95, "Adam beta2")
    adam_eps: float = opt(1e-8, "Adam epsilon")
    grad_clip_norm: float = opt(0.0, "global gradient-norm clip; 0 = off")
    muon_ns_coefficients: str = opt(
        "quintic", "Newton-Schulz coefficients: quintic (the baseline's) or polar_express"
    )
    muon_row_normalize: bool = opt(
        False, "MuonEq-R: scale each row of the update to unit norm before Newton-Schulz"
    )
    muon_wd: float = opt(0.0, "decoupled weight decay of the Muon matrices (p *= 1 - lr * wd each step)")
    embed_wd: float = opt(0.0, "decoupled weight decay of the embeddings (AdamW)")
    adam_wd: float = opt(0.0, "decoupled weight decay of the scalar/control tensors (AdamW)")
    ema_decay: float = opt(
        0.0, "keep an exponential moving average of the weights; evaluate and export it; 0 = off"
    )

    # --- the artifact ---
    quant_format: str = opt(
        "int8", "int8 (the challenge's per-row int8 format) | mixed (bits per tensor class, below)"
    )
    compressor: str = opt("zlib", "artifact compressor: " + " | ".join(COMPRESSORS))
    byte_shuffle: int = opt(0, "byte-shuffle the payload in groups of N bytes before compressing; 0 = off")
    embed_bits: int = opt(8, "mixed: bits of the embeddings (5-8; 16 = kept in fp16)")
    matrix_bits: int = opt(6, "mixed: bits of the attention and MLP matrices (5-8; 16 = fp16)")
    attn_bits: int = opt(0, "mixed: bits of the attention matrices; 0 = matrix_bits")
    mlp_bits: int = opt(0, "mixed: bits of the MLP matrices; 0 = matrix_bits")
    other_bits: int = opt(8, "mixed: bits of the other large tensors (e.g. an untied head)")
    embed_clip_sigmas: float = opt(
        0.0, "mixed: clip each embedding row at k * its std (SDClip); 0 = search the best of 5 percentiles"
    )
    matrix_clip_sigmas: float = opt(0.0, "mixed: SDClip k of the matrices; 0 = the percentile search")
    attn_clip_sigmas: float = opt(0.0, "mixed: SDClip k of the attention matrices; 0 = matrix_clip_sigmas")
    mlp_clip_sigmas: float = opt(0.0, "mixed: SDClip k of the MLP matrices; 0 = matrix_clip_sigmas")
    gptq_enabled: bool = opt(
        False, "mixed: GPTQ, rounding with error compensation from Hessians of the layers' inputs"
    )
    gptq_calibration_batches: int = opt(64, "GPTQ: training micro-batches run to collect the Hessians")
    gptq_reserve_seconds: float = opt(
        10.0, "GPTQ: seconds taken off the wallclock cap for calibration (it counts as training time)"
    )

    # --- execution ---
    compute_dtype: str = opt("auto", "auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float32")
    compile: str = opt("auto", "auto (on for GPUs: CUDA and Metal, off on CPUs) | on | off")
    mlx_max_microbatch_tokens: int = opt(8_192, "MLX: largest sub-batch (tokens) of a micro-batch")
    mlx_eager_eval: bool = opt(
        True, "MLX: evaluate the graph after every sub-batch (bounds memory on 16 GB Macs)"
    )
    collective_timeout_seconds: float = opt(
        300.0, "PyTorch, several ranks: a collective waiting longer fails the job; 0 = torch's 10-30 min"
    )
    memory_check: bool = opt(
        True, "refuse to train when the estimated memory per device exceeds the device's (off: try anyway)"
    )

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.model_dim // self.num_heads

    def local_accum_steps(self, world_size: int) -> int:
        """Micro-batches each rank runs per step."""
        return self.grad_accum_steps // world_size

    def uses_bf16(self, on_gpu: bool) -> bool:
        """Compute in bf16: when asked to, or by default on a GPU."""
        return self.compute_dtype == "bfloat16" or (self.compute_dtype == "auto" and on_gpu)

    @property
    def eval_window(self) -> int:
        """Tokens per evaluation sequence (non-overlapping) or window (sliding)."""
        return self.eval_seq_len or self.train_seq_len

    @property
    def train_cap_seconds(self) -> float:
        """The training-time cap the loop and the schedules use: the wallclock cap less the time
        reserved for GPTQ's calibration; 0 = none."""
        if self.max_wallclock_seconds <= 0:
            return 0.0
        return self.max_wallclock_seconds - (self.gptq_reserve_seconds if self.gptq_enabled else 0.0)

    def uses_compile(self, on_gpu: bool) -> bool:
        """Compile the step: when asked to, or by default on a GPU."""
        return self.compile == "on" or (self.compile == "auto" and on_gpu)

    def validate(self, world_size: int = 1) -> Config:
        """Raise PgolfError naming the first inconsistent setting; return self."""

        def require(ok: bool, message: str) -> None:
            if not ok:
                raise PgolfError(f"config: {message}")

        for f in fields(self):
            value = getattr(self, f.name)
            require(
                not isinstance(value, float) or math.isfinite(value), f"{f.name} must be finite, got {value}"
            )
        for names, ok, rule in (
            (POSITIVE_FIELDS, lambda v: v > 0, "must be positive"),
            (NON_NEGATIVE_FIELDS, lambda v: v >= 0, "must be >= 0"),
            (FRACTION_FIELDS, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            (UNIT_FIELDS, lambda v: 0 <= v <= 1, "must be in [0, 1]"),
        ):
            for name in names:
                require(ok(getattr(self, name)), f"{name} {rule}, got {getattr(self, name)}")
        require(0 <= self.seed <= SEED_MAX, f"seed must be in 0..{SEED_MAX} (2^32 - 1), got {self.seed}")
        require(self.vocab_size <= MAX_VOCAB, f"vocab_size must fit uint16 shards (<= {MAX_VOCAB})")
        require(
            self.num_layers <= MAX_LAYERS, f"num_layers must be at most {MAX_LAYERS}, got {self.num_layers}"
        )
        require(
            self.model_dim % self.num_heads == 0,
            f"num_heads={self.num_heads} must divide model_dim={self.model_dim}",
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}",
        )
        require(self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even for RoPE")
        require(
            self.run_id == Path(self.run_id).name and self.run_id not in (".", ".."),
            f"run_id must be a plain folder name, got {self.run_id!r}",
        )
        require(
            self.grad_accum_steps % world_size == 0,
            f"world size {world_size} must divide grad_accum_steps={self.grad_accum_steps}",
        )
        require(
            self.train_batch_tokens % (self.grad_accum_steps * self.train_seq_len) == 0,
            f"train_batch_tokens={self.train_batch_tokens} must be a multiple of "
            f"grad_accum_steps*train_seq_len={self.grad_accum_steps * self.train_seq_len}",
        )
        require(
            self.val_batch_size // self.grad_accum_steps >= self.eval_window,
            f"val_batch_size={self.val_batch_size} must hold grad_accum_steps sequences of "
            f"{self.eval_window} tokens (eval_seq_len, or train_seq_len)",
        )
        require(
            self.eval_stride <= self.eval_window,
            f"eval_stride={self.eval_stride} is longer than the evaluation window ({self.eval_window}): "
            "tokens between windows would never be scored",
        )
        for name in BITS_FIELDS:
            value = getattr(self, name)
            allowed = QUANT_BITS if name in ("embed_bits", "matrix_bits", "other_bits") else (0, *QUANT_BITS)
            require(value in allowed, f"{name} must be one of {', '.join(map(str, allowed))}, got {value}")
        require(
            self.byte_shuffle in (0, *range(2, 256)),
            f"byte_shuffle must be 0 (off) or a group size of 2..255 bytes, got {self.byte_shuffle}",
        )
        if self.gptq_enabled:
            require(self.quant_format == "mixed", "gptq_enabled needs quant_format=mixed")
            require(self.gptq_calibration_batches > 0, "gptq_calibration_batches must be positive")
            require(
                self.max_wallclock_seconds <= 0 or self.train_cap_seconds > 0,
                f"gptq_reserve_seconds={self.gptq_reserve_seconds} leaves no training time under "
                f"max_wallclock_seconds={self.max_wallclock_seconds}",
            )
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
            require(value in allowed, f"{name} must be {choices}, got {value!r}")
        require(
            self.rope_dims % 2 == 0 and self.rope_dims <= self.head_dim,
            f"rope_dims={self.rope_dims} must be even and at most head_dim={self.head_dim}",
        )
        require(int(self.mlp_mult * self.model_dim) >= 1, f"mlp_mult={self.mlp_mult} leaves the MLP no width")
        require(
            self.xsa_last_n <= self.num_layers,
            f"xsa_last_n={self.xsa_last_n} exceeds num_layers={self.num_layers}",
        )
        if self.ve_enabled:
            layers = self.ve_layer_indices
            require(bool(layers), "ve_layers must name at least one layer when ve_enabled is on")
            bad = [i for i in layers if not 0 <= i < self.num_layers]
            require(not bad, f"ve_layers: layer {bad[0] if bad else 0} is not in 0..{self.num_layers - 1}")
            require(len(set(layers)) == len(layers), f"ve_layers lists a layer twice: {self.ve_layers!r}")
        if self.num_loops > 0:
            require(
                self.loop_start <= self.loop_end < self.num_layers,
                f"the looped segment loop_start={self.loop_start}..loop_end={self.loop_end} must lie in "
                f"0..{self.num_layers - 1} with loop_start <= loop_end",
            )
        psl = self.parallel_start_layer
        if psl > 0:
            require(
                psl < self.num_layers,
                f"parallel_start_layer={psl} must be below num_layers={self.num_layers} (0 turns the lanes off)",
            )
            for looping in (False, True):
                decoder = self.layer_layout(looping)[1]
                lanes = [i >= psl for i in decoder]
                # Once split, the stream is two lanes: a serial layer after that would read a stale x.
                require(
                    lanes == sorted(lanes),
                    f"parallel_start_layer={psl}: the decoder order {decoder} runs a layer below {psl} "
                    "after a parallel one; raise parallel_start_layer or move the looped segment",
                )
        return self

    def layer_layout(self, looping: bool) -> tuple[list[int], list[int]]:
        """The physical layers the encoder and the decoder visit, in order.

        Looping (num_loops > 0 and switched on) repeats loop_start..loop_end so that the
        segment runs 1 + num_loops times; the visit list is then split in two halves,
        the encoder getting the shorter one when its length is odd.
        """
        n = self.num_layers
        if looping and self.num_loops > 0:
            segment = list(range(self.loop_start, self.loop_end + 1))
            order = list(range(self.loop_start)) + segment * (self.num_loops + 1)
            order += list(range(self.loop_end + 1, n))
        else:
            order = list(range(n))
        return order[: len(order) // 2], order[len(order) // 2 :]

    @property
    def ve_layer_indices(self) -> list[int]:
        """The layers that get the value embedding (empty when ve_enabled is off)."""
        if not self.ve_enabled:
            return []
        try:
            return [int(part) for part in self.ve_layers.split(",") if part.strip()]
        except ValueError:
            raise PgolfError(
                f"config: ve_layers must be comma-separated layer numbers, got {self.ve_layers!r}"
            ) from None

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, strict: bool = False) -> Config:
        """Build from a dict; unknown keys raise when strict, else are ignored (old checkpoints)."""
        known = field_names()
        unknown = sorted(set(data) - known)
        if strict and unknown:
            raise PgolfError(f"config: unknown key {unknown[0]!r}")
        return cls(**{k: _coerce(k, v) for k, v in data.items() if k in known})

    def replace(self, **changes: Any) -> Config:
        known = field_names()
        for key in changes:
            if key not in known:
                raise PgolfError(f"config: unknown key {key!r}")
        return dataclasses.replace(self, **{k: _coerce(k, v) for k, v in changes.items()})


def field_names() -> set[str]:
    return {f.name for f in fields(Config)}


def _field_type(name: str) -> type:
    default = getattr(Config(), name)
    return type(default)


def _coerce(name: str, value: Any) -> Any:
    """Convert strings (env vars, flags) and TOML values to the field's type, with a clear error."""
    kind = _field_type(name)
    try:
        if isinstance(value, (list, dict, tuple)) or (isinstance(value, bool) and kind is not bool):
            raise ValueError(value)
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, int):
                return value
            text = str(value).strip()
            if re.fullmatch(r"[+-]?\d[\d_]*", text):  # exact, however large (a seed, say)
                return int(text)
            number = float(text.replace("_", ""))  # 2e4 or 100.0: whole numbers only
            if not number.is_integer():
                raise ValueError(value)
            return int(number)
        if kind is float:
            return float(str(value).replace("_", "")) if isinstance(value, str) else float(value)
        return str(value)
    except (ValueError, TypeError, OverflowError):
        raise PgolfError(f"config: {name} expects {kind.__name__}, got {value!r}") from None


# ---------------------------------------------------------------------- presets
RECORD_0401: dict[str, Any] = {
    "data_path": "data/datasets/fineweb10B_sp4096",
    "tokenizer_path": "data/tokenizers/fineweb_4096_bpe.model",
    "vocab_size": 4096,
    "num_layers": 11,
    "mlp_mult": 4.0,
    "mlp_activation": "leaky_relu2",
    "xsa_last_n": 11,
    "rope_dims": 16,
    "ln_scale": True,
    "ve_enabled": True,
    "ve_dim": 128,
    "ve_layers": "9,10",
    "skip_gates_enabled": True,
    "qk_gain_init": 4.0,
    "train_seq_len": 2048,
    "train_batch_tokens": 786_432,
    "val_loss_every": 4000,
    "train_log_every": 500,
    "warmdown_frac": 0.667,
    "matrix_lr": 0.02,
    "scalar_lr": 0.02,
    "tied_embed_lr": 0.03,
    "muon_momentum": 0.99,
    "muon_momentum_warmup_start": 0.92,
    "muon_momentum_warmup_steps": 1500,
    "muon_wd": 0.085,
    "embed_wd": 0.085,
    "adam_wd": 0.02,
    "grad_clip_norm": 0.3,
    "ema_decay": 0.997,
    "train_loader": "coprime",
    # Its evaluation and artifact: sliding windows of 2048 at stride 64; int6 GPTQ attention and MLP
    # matrices with an int8 embedding, byte-shuffled and brotli-compressed; 10 s of the cap for GPTQ.
    "eval_stride": 64,
    "quant_format": "mixed",
    "embed_bits": 8,
    "matrix_bits": 6,
    "gptq_enabled": True,
    "gptq_calibration_batches": 64,
    "gptq_reserve_seconds": 10.0,
    "compressor": "brotli",
    "byte_shuffle": 2,
}
TINY: dict[str, Any] = {
    "num_layers": 4,
    "model_dim": 128,
    "num_heads": 4,
    "num_kv_heads": 2,
    "train_seq_len": 256,
    "train_batch_tokens": 8192,
    "grad_accum_steps": 2,
    "iterations": 300,
    "warmdown_iters": 100,
    "warmup_steps": 0,
    "max_wallclock_seconds": 0.0,
    "val_loss_every": 100,
    "val_batch_size": 16_384,
    "val_max_tokens": 65_536,
    "train_log_every": 25,
    "muon_momentum_warmup_steps": 100,
}
# record_0401 scaled to the tiny model: the embedded corpus, 4 layers, its features on the last layers.
RECORD_0401_TINY_CHANGES: dict[str, Any] = {
    "data_path": "data/datasets/sotu_sp1024",
    "tokenizer_path": "data/tokenizers/sotu_1024_bpe.model",
    "vocab_size": 1024,
    "xsa_last_n": 4,
    "ve_layers": "2,3",
    "ve_dim": 32,
    "muon_momentum_warmup_steps": 100,
    # 0.997 averages over ~330 steps: the whole of a 300-step run (measured: val_bpb 1.91 for the
    # average against 1.40 for the final weights). 0.95 averages over the last ~20.
    "ema_decay": 0.95,
}
PRESETS: dict[str, dict[str, Any]] = {
    # The challenge's "Naive Baseline": 9x512, 524,288 tokens/step, 10-minute cap.
    "baseline": {},
    # Record "Training Opt Seq4096 v1" (2026-03-19): same model, longer context.
    "seq4096": {
        "train_seq_len": 4096,
        "train_batch_tokens": 393_216,
        "warmdown_iters": 3000,
        "muon_momentum": 0.99,
        "muon_momentum_warmup_start": 0.92,
        "muon_momentum_warmup_steps": 1500,
        "tied_embed_lr": 0.030,
        "matrix_lr": 0.020,
        "scalar_lr": 0.020,
    },
    # Record 2026-04-01_Vocab4096_MLPMult4_WD085 (val_bpb 1.0979, 3-seed mean): its model, optimizer,
    # schedule, artifact (GPTQ int6 + int8 embedding, byte shuffle + brotli) and sliding-window
    # evaluation. Data: the sp4096 shards (`data download --repo-id kevclark/parameter-golf --variant sp4096`).
    "record_0401": RECORD_0401,
    # The same recipe at the tiny preset's size, for a few minutes on a CPU (the embedded corpus).
    "record_0401_tiny": {**RECORD_0401, **TINY, **RECORD_0401_TINY_CHANGES},
    # A CPU-friendly demo: minutes on a laptop CPU, clearly better than a unigram model.
    "tiny": TINY,
    # For tests: seconds on two CPU cores.
    "smoke": {
        "num_layers": 2,
        "model_dim": 64,
        "num_heads": 4,
        "num_kv_heads": 2,
        "train_seq_len": 64,
        "train_batch_tokens": 512,
        "grad_accum_steps": 2,
        "iterations": 4,
        "warmdown_iters": 2,
        "warmup_steps": 0,
        "max_wallclock_seconds": 0.0,
        "val_loss_every": 0,
        "val_batch_size": 1024,
        "val_max_tokens": 4096,
        "train_log_every": 1,
        "muon_momentum_warmup_steps": 2,
        "compute_dtype": "float32",
        "compile": "off",
        "mlx_max_microbatch_tokens": 128,
    },
}


def preset(name: str) -> Config:
    return Config().replace(**preset_values(name))


def preset_values(name: str) -> dict[str, Any]:
    """The fields a preset sets; an unknown name is refused with the nearest one suggested."""
    if name not in PRESETS:
        raise PgolfError(
            f"config: unknown preset {name!r}{did_you_mean(name, PRESETS)} (choose from {', '.join(PRESETS)})"
        )
    return PRESETS[name]


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a flat table of config fields: TOML, or JSON when the name ends in .json (a run's
    config.json); unknown keys are an error.

    Any readable file will do (`--config <(...)` too), up to MAX_CONFIG_BYTES: /dev/zero is refused."""
    p = Path(path)
    as_json = p.suffix.lower() == ".json"
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise PgolfError(f"config: {p} holds more than {MAX_CONFIG_BYTES:,} bytes: not a config file")
        text = raw.decode("utf-8")
        data = json.loads(text) if as_json else tomllib.loads(text)
    except FileNotFoundError:
        raise PgolfError(f"config: file not found: {p}") from None
    except UnicodeDecodeError:
        raise PgolfError(f"config: {p} is not UTF-8 text") from None
    except OSError as exc:
        raise PgolfError(f"config: cannot read {p}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise PgolfError(f"config: {p} is not valid {'JSON' if as_json else 'TOML'} ({exc})") from None
    if not isinstance(data, dict):
        raise PgolfError(f"config: {p} must hold one object of config fields")
    unknown = sorted(set(data) - field_names())
    if unknown:
        raise PgolfError(
            f"config: unknown key {unknown[0]!r} in {p}{did_you_mean(unknown[0], field_names())}"
        )
    for key, value in data.items():
        if value is None:
            raise PgolfError(f"config: {key} in {p} has no value (null)")
    return data


def env_names(environ: dict[str, str] | None = None) -> dict[str, str]:
    """{field: the environment variable that sets it} for the upstream variables present (e.g. MATRIX_LR)."""
    env = os.environ if environ is None else environ
    out = {name: name.upper() for name in sorted(field_names()) if name.upper() in env}
    for alias, name in ENV_ALIASES.items():
        if alias in env and name not in out:
            out[name] = alias
    return out


def from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The upstream environment variables that name a config field (e.g. MATRIX_LR)."""
    env = os.environ if environ is None else environ
    return {name: env[var] for name, var in env_names(env).items()}


DEFAULT_SOURCE = "default"


def resolve_sources(
    preset_name: str = "baseline",
    file_path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> tuple[Config, dict[str, str]]:
    """The config of preset, then file, then upstream env vars, then explicit overrides (flags), and
    where each field's value came from: 'default', 'preset P', 'file F', 'env VAR', 'flag', or
    'dataset D' for the paths a `dataset` looked up in the manifest.

    A layer that names a dataset sets data_path, tokenizer_path and vocab_size from the manifest,
    except those the same layer sets itself (a run's config.json holds all four).
    """
    env_vars = env_names(environ)
    layers = [
        {k: (v, f"preset {preset_name}") for k, v in preset_values(preset_name).items()},
        {k: (v, f"file {file_path}") for k, v in load_file(file_path).items()} if file_path else {},
        {k: (v, f"env {env_vars[k]}") for k, v in from_env(environ).items()},
        {k: (v, "flag") for k, v in (overrides or {}).items()},
    ]
    cfg, sources = Config(), dict.fromkeys(field_names(), DEFAULT_SOURCE)
    for layer in layers:
        name = layer.get("dataset", ("", ""))[0]
        if name and not {"data_path", "tokenizer_path", "vocab_size"} <= set(layer):
            from core.data.manifest import dataset_settings

            found = dataset_settings(str(name))
            layer = {**{k: (v, f"dataset {name}") for k, v in found.items()}, **layer}
        cfg = cfg.replace(**{k: value for k, (value, _) in layer.items()})
        sources.update({k: source for k, (_, source) in layer.items()})
    if not cfg.dataset:
        cfg = cfg.replace(dataset=Path(cfg.data_path).name)
        sources["dataset"] = "data_path"
    return cfg, sources


def resolve(
    preset_name: str = "baseline",
    file_path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Preset, then config file, then upstream env vars, then explicit overrides (flags)."""
    return resolve_sources(preset_name, file_path, overrides, environ)[0]


def given_values(cfg: Config, sources: dict[str, str]) -> dict[str, Any]:
    """The fields of `cfg` that were asked for (by a preset, a file, the environment or a flag)."""
    return {
        name: getattr(cfg, name)
        for name, source in sources.items()
        if source not in (DEFAULT_SOURCE, "data_path")
    }


def resumed_config(saved: dict[str, Any], cfg: Config, sources: dict[str, str]) -> Config:
    """The config a checkpoint was trained with, plus what was given now (by a preset named on the
    command line, a file, the environment or a flag) of RESUMABLE_FIELDS; anything else that differs
    from the checkpoint is refused by name."""
    base = Config.from_dict(saved)
    changes, refused = {}, []
    for name, value in given_values(cfg, sources).items():
        old = getattr(base, name)
        if value == old:
            continue
        if name in RESUMABLE_FIELDS:
            changes[name] = value
        else:
            refused.append(f"{name} (the checkpoint has {old!r}, {sources[name]} gives {value!r})")
    if refused:
        raise PgolfError(
            f"config: cannot change when resuming: {', '.join(refused)}; only {', '.join(RESUMABLE_FIELDS)} can"
        )
    resumed = base.replace(**changes)
    return resumed if resumed.dataset else resumed.replace(dataset=Path(resumed.data_path).name)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ['matrix_lr=0.02', 'iterations=100'] into a dict, checking each key."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_").lower()
        if not sep:
            raise PgolfError(f"config: override {pair!r} must look like key=value")
        if key not in field_names():
            raise PgolfError(f"config: unknown key {key!r}")
        out[key] = value
    return out
