"""The one training configuration, shared by both backends: every field declared once.

A field's declaration holds all there is to know about it: its default, its one-line meaning
(the --flag help), its section, the checks a value must pass, whether a resumed run may change
it (`resume`), and whether an artifact keeps it to be scored alone (`scoring`: the settings the
tensors' shapes do not tell). The lists other modules use are computed from the declarations
(`SCORING_FIELDS` here; `RESUMABLE_FIELDS`, `WRITING_FIELDS`, `EXPORT_FIELDS` in
core/config/sources.py, as only the CLI's commands read them); `Config.validate` runs each field's
checks, then the rules that span several fields.

Presets live in core/config/presets.py; files, the environment and flags in core/config/sources.py.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from decimal import Decimal, InvalidOperation
from typing import Any

from core.common.compress import COMPRESSORS
from core.common.errors import PgolfError
from core.data.shards import MAX_VOCAB, TRAIN_LOADERS

BUDGET_BYTES = 16_000_000  # the challenge's cap on artifact + code, decimal bytes
EVAL_LIMIT_SECONDS = 600.0  # the challenge's limit on the final evaluation, on its 8xH100
SEED_MAX = 2**32 - 1  # seeds in 0..SEED_MAX: a range numpy, torch and MLX all accept
# Far deeper than any model the 16 MB budget allows; it bounds the parameter table (and what an
# artifact's tensor names may declare) before anything is built from it.
MAX_LAYERS = 1024
# The mixed format's bits per class: int-N with per-row scales, or 16 = kept in fp16.
QUANT_BITS = (5, 6, 7, 8, 16)


@dataclass(frozen=True)
class AttentionGate:
    """A gate on each head's attention output, at most one on at a time: its weight is (heads, inputs) in
    every block, its math `GATE_MATH[name]` in core/model/walk.py. A new gate is one line here, its field
    (below, in the model section) and its math."""

    name: str  # the key of its math
    field: str  # the on/off field that turns it on
    weight: str  # its weight's name in a block
    windowed: bool  # its inputs are the first gate_window channels (else all model_dim)
    init_std: str | None  # the field holding its initial std (None, or a std of 0: zeros)
    int8_rows: bool  # stored as int8 rows with gated_attn_quant_gate (mixed format); else fp32


ATTENTION_GATES = (
    AttentionGate("attn_out", "attn_out_gate_enabled", "attn.attn_gate_proj.weight", True, None, False),
    AttentionGate("gated", "gated_attn_enabled", "attn.attn_gate_w", False, "gated_attn_init_std", True),
    AttentionGate("sparse", "sparse_attn_gate_enabled", "attn.attn_gate_w", True, "sparse_attn_gate_init_std", True),
)  # fmt: skip


@dataclass(frozen=True)
class Check:
    """A rule one field's value must follow: `ok(value)`, else the error reads "<field> <rule>, got <value>"."""

    rule: str
    ok: Callable[[Any], bool]
    choices: tuple = ()  # the values allowed, when the rule is a list of them


ANY = Check("", lambda v: True)  # any value of the field's type (finite, for a float)
POSITIVE = Check("must be positive", lambda v: v > 0)
NON_NEGATIVE = Check("must be >= 0", lambda v: v >= 0)
FRACTION = Check("must be in [0, 1)", lambda v: 0 <= v < 1)
UNIT = Check("must be in [0, 1]", lambda v: 0 <= v <= 1)
PLAIN_NAME = Check("must be a plain folder name", lambda v: "/" not in v and v not in (".", ".."))
LAYER_LIST = Check(
    "must be comma-separated layer numbers (e.g. 9,10), none blank",
    lambda v: re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", v) is not None,
)
NAME_LIST = Check(
    "must be empty or comma-separated names (e.g. tensorboard,wandb), none blank",
    lambda v: re.fullmatch(r"(\s*[\w-]+\s*(,\s*[\w-]+\s*)*)?", v) is not None,
)
BYTE_SHUFFLE = Check("must be 0 (off) or a group size of 2..255 bytes", lambda v: v == 0 or 2 <= v <= 255)


def at_most(cap: int, rule: str = "") -> Check:
    return Check(rule or f"must be at most {cap}", lambda v: v <= cap)


def one_of(*allowed: Any) -> Check:
    listed = f"{', '.join(map(str, allowed[:-1]))} or {allowed[-1]}"
    return Check(f"must be {listed}", lambda v: v in allowed, allowed)


def opt(
    default: Any,
    check: Check | tuple[Check, ...],
    *,
    help: str = "",
    section: str = "",
    resume: bool = False,
    scoring: bool = False,
) -> Any:
    """A Config field: its default, one-line meaning (the --flag help), section (one of
    core/config/sources.py's SECTIONS, which tests/test_config.py checks),
    check(s), whether a resumed run may change it, and whether scoring an artifact alone needs it."""
    checks = check if isinstance(check, tuple) else (check,)
    info = {"help": help, "section": section, "checks": checks, "resume": resume, "scoring": scoring}
    return field(default=default, metadata=info)


@dataclass
class Config:
    # --- data ---
    dataset: str = opt(
        "",
        ANY,
        help="a dataset of data/manifest.json by name (e.g. fineweb10B_sp1024): sets data_path, tokenizer_path "
        "and vocab_size; empty = data_path's folder",
        section="data",
        scoring=True,
    )
    data_path: str = opt(
        "data/datasets/sotu_sp1024",
        ANY,
        help="folder holding fineweb_{train,val}_*.bin shards",
        section="data",
    )
    train_loader: str = opt(
        "sequential",
        one_of(*TRAIN_LOADERS),
        help="sequential (shards in order, upstream's stream) | coprime (the 03-29..04-04 records' "
        "coprime-stride multi-shard sampler, seeded by the shard names)",
        section="data",
    )
    tokenizer_path: str = opt(
        "data/tokenizers/sotu_1024_bpe.model", ANY, help="SentencePiece model used for BPB", section="data"
    )
    caseops_enabled: bool = opt(
        False,
        ANY,
        help="val_bpb counts the validation byte sidecar (fineweb_val_bytes_*.bin, the bytes of text each token "
        "stands for) instead of the tokenizer's byte tables: CaseOps data, and data whose tokenizer's tables "
        "would miscount (docs/tokenizers.md); --dataset sets it from the manifest",
        section="data",
        scoring=True,
    )
    run_id: str = opt(
        "",
        PLAIN_NAME,
        help="name of the run directory under out_dir; empty = timestamp",
        section="run",
        resume=True,
    )
    run_group: str = opt(
        "",
        ANY,
        help="the experiment a run belongs to (train --seeds names it): runs groups them, --compare tests them",
        section="run",
    )
    out_dir: str = opt("runs", ANY, help="where run directories are created", section="run", resume=True)
    seed: int = opt(
        1337,
        Check(f"must be in 0..{SEED_MAX} (2^32 - 1)", lambda v: 0 <= v <= SEED_MAX),
        help="seeds the numpy initialisation (identical weights in both backends); 0..2^32-1",
        section="run",
    )
    init_from: str = opt(
        "",
        ANY,
        help="start from these weights instead of the seeded init, with a fresh optimizer at step 0: a pgolf "
        "checkpoint, a safetensors file of weights, or a torch state dict (a record's final_model.pt)",
        section="run",
    )

    # --- training length and batch ---
    iterations: int = opt(
        20_000,
        NON_NEGATIVE,
        help="optimizer steps (the wallclock cap may stop earlier)",
        section="schedule",
        resume=True,
    )
    train_batch_tokens: int = opt(
        524_288,
        POSITIVE,
        help="tokens per optimizer step, summed over ranks and micro-batches",
        section="schedule",
    )
    train_seq_len: int = opt(
        1024, POSITIVE, help="tokens per training sequence", section="schedule", scoring=True
    )
    grad_accum_steps: int = opt(
        8,
        POSITIVE,
        help="micro-batches per step on one process, split evenly over W ranks",
        section="schedule",
    )
    max_wallclock_seconds: float = opt(
        600.0,
        NON_NEGATIVE,
        help="training-time cap (validation excluded); 0 = none",
        section="schedule",
        resume=True,
    )
    warmup_steps: int = opt(
        20, NON_NEGATIVE, help="compile-warmup steps, run for real then undone", section="schedule"
    )
    warmdown_iters: int = opt(
        1200,
        NON_NEGATIVE,
        help="steps of the final linear LR decay (step-times under a wallclock cap)",
        section="schedule",
    )
    warmdown_frac: float = opt(
        0.0,
        UNIT,
        help="if > 0: the last fraction of the run (steps, or the wallclock cap) decays the LR instead",
        section="schedule",
    )
    min_lr: float = opt(0.0, UNIT, help="floor of the LR multiplier during the warmdown", section="schedule")

    # --- validation, logging and checkpoints ---
    val_loss_every: int = opt(
        1000,
        NON_NEGATIVE,
        help="validate every N steps (and always at the end); 0 = only at the end",
        section="eval",
        resume=True,
    )
    val_batch_size: int = opt(
        524_288,
        POSITIVE,
        help="validation tokens per forward pass x grad_accum_steps (each pass holds 1/grad_accum_steps)",
        section="eval",
        resume=True,
    )
    val_max_tokens: int = opt(
        0,
        NON_NEGATIVE,
        help="cap on validation tokens for quick looks; 0 = the whole split",
        section="eval",
        resume=True,
        scoring=True,
    )
    train_log_every: int = opt(
        200, NON_NEGATIVE, help="log train loss every N steps (and the first 10)", section="run", resume=True
    )
    checkpoint_every: int = opt(
        0,
        NON_NEGATIVE,
        help="write a resumable checkpoint every N steps; 0 = only at the end",
        section="run",
        resume=True,
    )
    checkpoint_minutes: float = opt(
        10.0,
        NON_NEGATIVE,
        help="also write one every N minutes of training time, replacing the last timed one; 0 = off",
        section="run",
        resume=True,
    )
    report_to: str = opt(
        "",
        NAME_LIST,
        help="also send the metrics to: tensorboard, wandb, trackio (comma-separated); empty = only metrics.jsonl",
        section="run",
        resume=True,
    )
    abort_behind: str = opt(
        "",
        ANY,
        help="a reference run's directory: stop (checkpoint, exit status 4) at a validation whose val_bpb is above "
        "the reference's at that step (linear between its validations) by more than abort_margin",
        section="run",
        resume=True,
    )
    abort_margin: float = opt(
        0.01,
        NON_NEGATIVE,
        help="how far behind abort_behind's run, in val_bpb, a run may be before it stops",
        section="run",
        resume=True,
    )
    eval_seq_len: int = opt(
        0,
        NON_NEGATIVE,
        help="tokens per evaluation sequence or window; 0 = train_seq_len",
        section="eval",
        scoring=True,
    )
    eval_stride: int = opt(
        0,
        NON_NEGATIVE,
        help="sliding-window evaluation: each window of eval_seq_len advances by, and scores, this many "
        "tokens (the first scores all); 0 = non-overlapping sequences",
        section="eval",
        scoring=True,
    )
    eval_batch_seqs: int = opt(
        32, POSITIVE, help="sliding windows per forward pass on each rank", section="eval", scoring=True
    )
    eval_protocol: str = opt(
        "rows",
        one_of("rows", "flat"),
        help="the plain figure's batches: rows (pgolf's: rows of eval_seq_len, each its own sequence) | flat "
        "(record 2026-04-27's eval_val: val_batch_size / grad_accum_steps tokens per rank as one sequence, "
        "documents cut at each bos_id and every eval_seq_len tokens, a tail short of a whole batch left out; "
        "needs varlen_attn_enabled)",
        section="eval",
        scoring=True,
    )
    # --- test-time training (core/eval/ttt.py): scored first, then learnt from ---
    ttt_enabled: bool = opt(
        False,
        ANY,
        help="also score with test-time training: per-document LoRA adapters, each chunk scored, then learnt",
        section="eval",
        scoring=True,
    )
    ttt_mode: str = opt(
        "lora",
        one_of("lora", "full"),
        help="lora: per-document adapters and global phases (records 2026-04-13 on); full: the stream in chunks "
        "of ttt_chunk_tokens, each scored with sliding windows, then every weight trained on it (2026-04-06 to 04-09)",
        section="eval",
        scoring=True,
    )
    # -- full mode (ttt_mode full): every weight trained on each chunk by SGD --
    ttt_chunk_tokens: int = opt(
        32768,
        POSITIVE,
        help="full mode: validation tokens per chunk, scored then trained on",
        section="eval",
        scoring=True,
    )
    ttt_lr: float = opt(
        0.005,
        NON_NEGATIVE,
        help="full mode: SGD learning rate, cosine over the chunks",
        section="eval",
        scoring=True,
    )
    ttt_momentum: float = opt(0.9, FRACTION, help="full mode: SGD momentum", section="eval", scoring=True)
    ttt_epochs: int = opt(
        3,
        (NON_NEGATIVE, at_most(100)),
        help="full mode: passes over each chunk",
        section="eval",
        scoring=True,
    )
    ttt_batch_seqs: int = opt(
        32,
        POSITIVE,
        help="full mode: windows per scoring forward, and sequences per SGD step",
        section="eval",
        scoring=True,
    )
    ttt_grad_clip: float = opt(
        1.0, NON_NEGATIVE, help="full mode: gradient norm clip; 0 = off", section="eval", scoring=True
    )
    ttt_freeze_blocks: int = opt(
        0, NON_NEGATIVE, help="full mode: the first N blocks are not trained", section="eval", scoring=True
    )
    # -- LoRA mode (ttt_mode lora): per-document adapters --
    ttt_lora_rank: int = opt(
        96, (POSITIVE, at_most(4096)), help="rank of each TTT LoRA adapter", section="eval", scoring=True
    )
    ttt_lora_alpha: float = opt(
        144.0,
        POSITIVE,
        help="TTT LoRA scale numerator: adapters add alpha/rank * (x A^T) B^T",
        section="eval",
        scoring=True,
    )
    ttt_warm_start_a: bool = opt(
        True,
        ANY,
        help="keep each adapter's A from one document batch to the next (B always restarts at 0)",
        section="eval",
        scoring=True,
    )
    ttt_lora_lr: float = opt(
        1e-4, NON_NEGATIVE, help="learning rate of the TTT adapters", section="eval", scoring=True
    )
    ttt_chunk_size: int = opt(
        48,
        POSITIVE,
        help="tokens of a document scored, then learnt from, at a time",
        section="eval",
        scoring=True,
    )
    ttt_eval_seq_len: int = opt(
        2048,
        POSITIVE,
        help="most tokens of a document a TTT forward sees (the chunk and its context)",
        section="eval",
        scoring=True,
    )
    ttt_batch_size: int = opt(
        64, POSITIVE, help="documents adapted side by side", section="eval", scoring=True
    )
    ttt_grad_steps: int = opt(
        1,
        (NON_NEGATIVE, at_most(100)),
        help="optimizer steps on each chunk after scoring it",
        section="eval",
        scoring=True,
    )
    ttt_beta1: float = opt(0.0, FRACTION, help="TTT Adam beta1 (SGD: momentum)", section="eval", scoring=True)
    ttt_beta2: float = opt(0.999, FRACTION, help="TTT Adam beta2", section="eval", scoring=True)
    ttt_weight_decay: float = opt(
        1.0, NON_NEGATIVE, help="TTT decoupled weight decay", section="eval", scoring=True
    )
    ttt_k_lora: bool = opt(True, ANY, help="an adapter on the keys too", section="eval", scoring=True)
    ttt_mlp_lora: bool = opt(True, ANY, help="an adapter on each MLP too", section="eval", scoring=True)
    ttt_o_lora: bool = opt(
        True, ANY, help="an adapter on each attention output too", section="eval", scoring=True
    )
    ttt_optimizer: str = opt(
        "adam",
        one_of("adam", "sgd"),
        help="the adapters' optimizer: adam (AdamW) or sgd",
        section="eval",
        scoring=True,
    )
    # -- LoRA mode's global phases: every weight trained on the documents scored so far --
    phased_ttt_prefix_docs: int = opt(
        2000,
        NON_NEGATIVE,
        help="documents scored before the global phases end (the phases' training data)",
        section="eval",
        scoring=True,
    )
    phased_ttt_num_phases: int = opt(
        1,
        (NON_NEGATIVE, at_most(1000)),
        help="global SGD phases, at even steps through the prefix documents; 0 = none",
        section="eval",
        scoring=True,
    )
    global_ttt_lr: float = opt(
        0.001,
        NON_NEGATIVE,
        help="global phase: SGD learning rate of every weight",
        section="eval",
        scoring=True,
    )
    global_ttt_momentum: float = opt(
        0.9, FRACTION, help="global phase: SGD momentum", section="eval", scoring=True
    )
    global_ttt_epochs: int = opt(
        1,
        (NON_NEGATIVE, at_most(100)),
        help="global phase: passes over each chunk of scored tokens",
        section="eval",
        scoring=True,
    )
    global_ttt_chunk_tokens: int = opt(
        32768,
        POSITIVE,
        help="global phase: scored tokens per LR step (the last chunk is not trained on)",
        section="eval",
        scoring=True,
    )
    global_ttt_batch_seqs: int = opt(
        32,
        POSITIVE,
        help="global phase: sequences of eval_seq_len per SGD step, shared out over the ranks",
        section="eval",
        scoring=True,
    )
    global_ttt_warmup_start_lr: float = opt(
        0.0, NON_NEGATIVE, help="global phase: LR of the first warm-up chunk", section="eval", scoring=True
    )
    global_ttt_warmup_chunks: int = opt(
        0,
        NON_NEGATIVE,
        help="global phase: chunks of linear LR warm-up before the cosine decay",
        section="eval",
        scoring=True,
    )
    global_ttt_grad_clip: float = opt(
        1.0, NON_NEGATIVE, help="global phase: gradient norm clip; 0 = off", section="eval", scoring=True
    )
    global_ttt_respect_doc_boundaries: bool = opt(
        True,
        ANY,
        help="global phase: train with the model's document-masked attention (varlen_attn_enabled); off: "
        "plain causal attention over each sequence; without varlen_attn_enabled nothing changes",
        section="eval",
        scoring=True,
    )

    # --- model shape ---
    bos_id: int = opt(
        1,
        NON_NEGATIVE,
        help="the token that starts every document (the tokenizer's BOS): SmearGate never smears across it, "
        "document-masked attention never attends across it",
        section="data",
        scoring=True,
    )
    vocab_size: int = opt(
        1024,
        (POSITIVE, at_most(MAX_VOCAB, f"must fit uint16 shards (<= {MAX_VOCAB})")),
        help="must equal the tokenizer's vocabulary",
        section="model",
    )
    num_layers: int = opt(
        9,
        (POSITIVE, at_most(MAX_LAYERS)),
        help="transformer blocks (first half encoder, second half decoder of the U-Net)",
        section="model",
    )
    model_dim: int = opt(512, POSITIVE, help="residual width", section="model")
    num_heads: int = opt(8, POSITIVE, help="query heads", section="model")
    num_kv_heads: int = opt(4, POSITIVE, help="key/value heads (grouped-query attention)", section="model")
    mlp_mult: float = opt(2.0, POSITIVE, help="MLP hidden width = int(mlp_mult * model_dim)", section="model")
    mlp_activation: str = opt(
        "relu2",
        one_of("relu2", "leaky_relu2"),
        help="relu2 (relu(x)^2) | leaky_relu2 (leaky_relu(x, 0.5)^2)",
        section="model",
        scoring=True,
    )
    tie_embeddings: bool = opt(
        True, ANY, help="share the token embedding with the output head", section="model"
    )
    rope_base: float = opt(10_000.0, POSITIVE, help="RoPE frequency base", section="model", scoring=True)
    logit_softcap: float = opt(30.0, POSITIVE, help="logits = c * tanh(z / c)", section="model", scoring=True)
    qk_gain_init: float = opt(1.5, ANY, help="initial per-head query gain", section="model")
    rope_dims: int = opt(
        0,
        NON_NEGATIVE,
        help="rotate only the first rope_dims dimensions of each head (partial RoPE); 0 = all",
        section="model",
        scoring=True,
    )
    rope_yarn: bool = opt(
        False,
        ANY,
        help="RoPE past train_seq_len: an input of L > train_seq_len tokens rotates with the base rope_base "
        "* (L / train_seq_len)^(R / (R - 2)), R the rotated dims (ROPE_YARN)",
        section="model",
        scoring=True,
    )
    rope_precision: str = opt(
        "float32",
        one_of("float32", "bf16_inv_freq", "bfloat16"),
        help="RoPE tables at the model's own base: float32 | bf16_inv_freq (the inverse frequencies "
        "rounded to bf16, as a model cast to bf16 keeps them) | bfloat16 (the positions, angles, cos and sin "
        "too); rescaled tables (rope_yarn) are float32",
        section="model",
        scoring=True,
    )
    ln_scale: bool = opt(
        False,
        ANY,
        help="scale each block's normed inputs by 1/sqrt(layer + 1)",
        section="model",
        scoring=True,
    )
    xsa_last_n: int = opt(
        0,
        NON_NEGATIVE,
        help="XSA on the last N layers: remove each token's own value direction from attention's output",
        section="model",
        scoring=True,
    )
    ve_enabled: bool = opt(
        False,
        ANY,
        help="value embeddings: a shared token embedding added to the values of ve_layers",
        section="model",
        scoring=True,
    )
    ve_dim: int = opt(
        128,
        POSITIVE,
        help="width of the value embedding (projected to the kv width when different)",
        section="model",
        scoring=True,
    )
    ve_layers: str = opt(
        "9,10",
        LAYER_LIST,
        help="comma-separated layers that receive the value embedding",
        section="model",
        scoring=True,
    )
    skip_gates_enabled: bool = opt(
        False,
        ANY,
        help="U-Net skips blended in through a sigmoid gate per channel",
        section="model",
        scoring=True,
    )
    smear_gate_enabled: bool = opt(
        False,
        ANY,
        help="SmearGate: each token embedding x_t gains lambda * sigmoid(W x_t[:gate_window]) * x_(t-1), "
        "except at a document start (bos_id)",
        section="model",
        scoring=True,
    )
    varlen_attn_enabled: bool = opt(
        False,
        ANY,
        help="document-masked attention: a token attends only within its segment of the row (a new one "
        "at each bos_id and every max(train_seq_len, eval_seq_len) tokens from a segment's start), in "
        "training, evaluation and test-time training",
        section="model",
        scoring=True,
    )
    gate_window: int = opt(
        12,
        POSITIVE,
        help="how many leading channels drive SmearGate, AttnOutGate and the sparse attention gate",
        section="model",
        scoring=True,
    )
    attn_out_gate_enabled: bool = opt(
        False,
        ANY,
        help="AttnOutGate: each head's attention output times 2 * sigmoid(W src_t[:gate_window]) (W starts "
        "at zero: a gate of 1)",
        section="model",
        scoring=True,
    )
    attn_out_gate_src: str = opt(
        "proj",
        one_of("proj", "q"),
        help="what drives AttnOutGate: the attention's input (proj) or its raw query projection (q)",
        section="model",
        scoring=True,
    )
    gated_attn_enabled: bool = opt(
        False,
        ANY,
        help="gated attention: each head's attention output times sigmoid(W x_t), W (heads, model_dim)",
        section="model",
        scoring=True,
    )
    gated_attn_init_std: float = opt(
        0.01, NON_NEGATIVE, help="std of gated attention's initial W", section="model"
    )
    sparse_attn_gate_enabled: bool = opt(
        False,
        ANY,
        help="sparse attention gate: each head's output times sigmoid(scale * W x_t[:gate_window])",
        section="model",
        scoring=True,
    )
    sparse_attn_gate_init_std: float = opt(
        0.0,
        NON_NEGATIVE,
        help="std of the sparse attention gate's initial W; 0 = zeros (a gate of 1/2)",
        section="model",
    )
    sparse_attn_gate_scale: float = opt(
        1.0, ANY, help="the sparse attention gate's logit scale", section="model", scoring=True
    )
    num_loops: int = opt(
        0,
        NON_NEGATIVE,
        help="depth recurrence: once looping is on, layers loop_start..loop_end run 1 + num_loops times; 0 = off",
        section="model",
        scoring=True,
    )
    loop_start: int = opt(
        3, NON_NEGATIVE, help="first layer of the looped segment", section="model", scoring=True
    )
    loop_end: int = opt(
        5, NON_NEGATIVE, help="last layer of the looped segment (inclusive)", section="model", scoring=True
    )
    enable_looping_at: float = opt(
        0.35,
        UNIT,
        help="looping turns on at this fraction of training (steps, or the wallclock cap), for good",
        section="schedule",
    )
    parallel_start_layer: int = opt(
        0,
        NON_NEGATIVE,
        help="parallel residual lanes (attention and MLP side by side) from decoder layer N on; 0 = off",
        section="model",
        scoring=True,
    )
    parallel_final_lane: str = opt(
        "mean",
        one_of("mean", "mlp", "attn"),
        help="the lanes' output to the head: mean | mlp (lane 1) | attn (lane 0)",
        section="model",
        scoring=True,
    )
    tied_embed_init_std: float = opt(
        0.005, NON_NEGATIVE, help="std of the (tied) embedding init", section="model"
    )

    # --- optimizers ---
    embed_lr: float = opt(0.6, NON_NEGATIVE, help="Adam lr of the embedding when untied", section="optimizer")
    head_lr: float = opt(0.008, NON_NEGATIVE, help="Adam lr of the untied output head", section="optimizer")
    tied_embed_lr: float = opt(0.05, NON_NEGATIVE, help="Adam lr of the tied embedding", section="optimizer")
    matrix_lr: float = opt(0.04, NON_NEGATIVE, help="Muon lr of the 2-D block matrices", section="optimizer")
    scalar_lr: float = opt(
        0.04,
        NON_NEGATIVE,
        help="Adam lr of vectors, scalars, control tensors and skip weights",
        section="optimizer",
    )
    muon_momentum: float = opt(0.95, FRACTION, help="Muon momentum after warmup", section="optimizer")
    muon_backend_steps: int = opt(
        5, (NON_NEGATIVE, at_most(100)), help="Newton-Schulz iterations", section="optimizer"
    )
    muon_momentum_warmup_start: float = opt(
        0.85, FRACTION, help="Muon momentum at step 0", section="optimizer"
    )
    muon_momentum_warmup_steps: int = opt(
        500, NON_NEGATIVE, help="steps of the linear momentum warmup", section="optimizer"
    )
    beta1: float = opt(0.9, FRACTION, help="Adam beta1", section="optimizer")
    beta2: float = opt(0.95, FRACTION, help="Adam beta2", section="optimizer")
    adam_eps: float = opt(1e-8, POSITIVE, help="Adam epsilon", section="optimizer")
    grad_clip_norm: float = opt(
        0.0, NON_NEGATIVE, help="global gradient-norm clip; 0 = off", section="optimizer"
    )
    muon_ns_coefficients: str = opt(
        "quintic",
        one_of("quintic", "polar_express"),
        help="Newton-Schulz coefficients: quintic (the baseline's) or polar_express",
        section="optimizer",
    )
    muon_row_normalize: bool = opt(
        False,
        ANY,
        help="MuonEq-R: scale each row of the update to unit norm before Newton-Schulz",
        section="optimizer",
    )
    muon_wd: float = opt(
        0.0,
        NON_NEGATIVE,
        help="decoupled weight decay of the Muon matrices (p *= 1 - lr * wd each step)",
        section="optimizer",
    )
    wd_taper_start_frac: float = opt(
        1.0,
        UNIT,
        help="Muon's weight decay tapers linearly from this fraction of training (steps, or the wallclock "
        "cap) on; 1 = no taper",
        section="schedule",
    )
    wd_taper_final_mult: float = opt(
        1.0,
        NON_NEGATIVE,
        help="the factor on Muon's weight decay at the end of the taper",
        section="schedule",
    )
    embed_wd: float = opt(
        0.0, NON_NEGATIVE, help="decoupled weight decay of the embeddings (AdamW)", section="optimizer"
    )
    adam_wd: float = opt(
        0.0,
        NON_NEGATIVE,
        help="decoupled weight decay of the scalar/control tensors (AdamW)",
        section="optimizer",
    )
    ema_decay: float = opt(
        0.0,
        FRACTION,
        help="keep an exponential moving average of the weights; evaluate and export it; 0 = off",
        section="optimizer",
    )

    # --- the artifact ---
    quant_format: str = opt(
        "int8",
        one_of("int8", "mixed"),
        help="int8 (the challenge's per-row int8 format) | mixed (bits per tensor class, below)",
        section="artifact",
    )
    compressor: str = opt(
        "zlib",
        one_of(*COMPRESSORS),
        help="artifact compressor: " + " | ".join(COMPRESSORS) + " (pergroup: the int8 matrices of "
        "each kind across layers by the lrzip program, the rest by brotli; needs lrzip installed)",
        section="artifact",
    )
    byte_shuffle: int = opt(
        0,
        BYTE_SHUFFLE,
        help="byte-shuffle the payload in groups of N bytes before compressing (pergroup: the part it "
        "compresses with brotli); 0 = off",
        section="artifact",
    )
    # -- bits per class (embedding, matrices, attention, MLP, other) --
    embed_bits: int = opt(
        8,
        one_of(*QUANT_BITS),
        help="mixed: bits of the embeddings (5-8; 16 = kept in fp16)",
        section="artifact",
    )
    matrix_bits: int = opt(
        6,
        one_of(*QUANT_BITS),
        help="mixed: bits of the attention and MLP matrices (5-8; 16 = fp16)",
        section="artifact",
    )
    attn_bits: int = opt(
        0,
        one_of(0, *QUANT_BITS),
        help="mixed: bits of the attention matrices; 0 = matrix_bits",
        section="artifact",
    )
    mlp_bits: int = opt(
        0, one_of(0, *QUANT_BITS), help="mixed: bits of the MLP matrices; 0 = matrix_bits", section="artifact"
    )
    other_bits: int = opt(
        8,
        one_of(*QUANT_BITS),
        help="mixed: bits of the other large tensors (e.g. an untied head)",
        section="artifact",
    )
    # -- per class (mixed format): tensors this small stay in fp16, not quantized --
    embed_passthrough_numel: int = opt(
        65_536,
        NON_NEGATIVE,
        help="mixed: embedding tensors of at most this many values stay in fp16 (the records: 65,536)",
        section="artifact",
    )
    attn_passthrough_numel: int = opt(
        65_536,
        NON_NEGATIVE,
        help="mixed: attention matrices of at most this many values stay in fp16 (the records: 65,536)",
        section="artifact",
    )
    mlp_passthrough_numel: int = opt(
        65_536,
        NON_NEGATIVE,
        help="mixed: MLP matrices of at most this many values stay in fp16 (the records: 65,536)",
        section="artifact",
    )
    other_passthrough_numel: int = opt(
        65_536,
        NON_NEGATIVE,
        help="mixed: other tensors of at most this many values stay in fp16 (the records: 65,536)",
        section="artifact",
    )
    # -- per class (mixed format): the clip, SDClip's k (0: the records' percentile search) --
    embed_clip_sigmas: float = opt(
        0.0,
        NON_NEGATIVE,
        help="mixed: clip each embedding row at k * its std (SDClip); 0 = search the best of 5 percentiles",
        section="artifact",
    )
    matrix_clip_sigmas: float = opt(
        0.0,
        NON_NEGATIVE,
        help="mixed: SDClip k of the matrices; 0 = the percentile search",
        section="artifact",
    )
    attn_clip_sigmas: float = opt(
        0.0,
        NON_NEGATIVE,
        help="mixed: SDClip k of the attention matrices; 0 = matrix_clip_sigmas",
        section="artifact",
    )
    mlp_clip_sigmas: float = opt(
        0.0,
        NON_NEGATIVE,
        help="mixed: SDClip k of the MLP matrices; 0 = matrix_clip_sigmas",
        section="artifact",
    )
    gated_attn_quant_gate: bool = opt(
        False,
        ANY,
        help="the attention gates' weights (gated or sparse) stored as int8 rows instead of fp32 (mixed format)",
        section="artifact",
    )
    # -- LQER: low-rank corrections of the largest quantization errors --
    lqer_enabled: bool = opt(
        False,
        ANY,
        help="LQER: the lqer_top_k quantized matrices with the largest error keep a rank-lqer_rank "
        "correction of it (mixed format)",
        section="artifact",
    )
    lqer_rank: int = opt(4, POSITIVE, help="rank of each LQER correction", section="artifact")
    lqer_top_k: int = opt(3, POSITIVE, help="how many matrices get an LQER correction", section="artifact")
    lqer_factor_bits: int = opt(
        4,
        one_of(2, 3, 4, 5, 6, 7, 8),
        help="bits of the LQER factors in the symmetric packing",
        section="artifact",
    )
    lqer_asym_enabled: bool = opt(
        True,
        ANY,
        help="LQER factors packed asymmetrically: A int2, B int4 in groups (where B's size allows)",
        section="artifact",
    )
    lqer_asym_group: int = opt(
        64, POSITIVE, help="values of B per fp16 scale in the asymmetric packing", section="artifact"
    )
    # -- GPTQ: quantization with error compensation, its calibration --
    gptq_enabled: bool = opt(
        False,
        ANY,
        help="mixed: GPTQ, rounding with error compensation from Hessians of the layers' inputs",
        section="artifact",
    )
    gptq_calibration_batches: int = opt(
        64, NON_NEGATIVE, help="GPTQ: training micro-batches run to collect the Hessians", section="artifact"
    )
    gptq_reserve_seconds: float = opt(
        10.0,
        NON_NEGATIVE,
        help="GPTQ: seconds taken off the wallclock cap for calibration and the artifact fit (it counts as training time)",
        section="artifact",
    )
    # -- the artifact fitted to a byte cap --
    artifact_fit_bytes: int = opt(
        0,
        NON_NEGATIVE,
        help="choose the artifact settings (bits, clips, fp16 floors, GPTQ, LQER, compressor) with the lowest "
        "calibration loss whose artifact + code fits in this many bytes (mixed format); 0 = off",
        section="artifact",
    )
    artifact_fit_margin: int = opt(
        0,
        NON_NEGATIVE,
        help="the artifact fit aims this many bytes under artifact_fit_bytes, so that other seeds' artifacts "
        "(a few KB apart: docs/submitting.md) fit too",
        section="artifact",
    )
    budget_bytes: int = opt(
        BUDGET_BYTES,
        (POSITIVE, at_most(BUDGET_BYTES)),
        help="the cap on artifact + code bytes: a run over it ends with exit status 3 (lower it to "
        "keep a margin; never above the challenge's 16,000,000)",
        section="artifact",
    )
    max_eval_seconds: float = opt(
        EVAL_LIMIT_SECONDS,
        NON_NEGATIVE,
        help="warn when the final evaluation (decompression included) takes longer: the challenge's "
        "limit on its 8xH100; 0 = off",
        section="eval",
    )
    artifact_fit_tokens: int = opt(
        131_072,
        POSITIVE,
        help="the artifact fit: training tokens it scores settings on, from the end of the training "
        "stream (never validation tokens)",
        section="artifact",
    )
    artifact_fit_keep_compressor: bool = opt(
        False,
        ANY,
        help="the artifact fit keeps compressor and byte_shuffle instead of trying brotli, zstd, lzma and "
        "pergroup (where lrzip is installed): an evaluation machine without lrzip, or a fit with fewer "
        "compressions",
        section="artifact",
    )

    # --- execution ---
    compute_dtype: str = opt(
        "auto",
        one_of("auto", "bfloat16", "float32"),
        help="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float32",
        section="execution",
    )
    compile: str = opt(
        "auto",
        one_of("auto", "on", "off"),
        help="auto (on for GPUs: CUDA and Metal, off on CPUs) | on | off",
        section="execution",
        resume=True,
    )
    compile_backend: str = opt(
        "inductor",
        one_of("inductor", "aot_eager", "eager"),
        help="PyTorch: torch.compile's backend when compile is on: inductor (fused kernels) | aot_eager "
        "(the same graphs and autograd, eager kernels: tells a dynamo problem from an inductor one) | eager",
        section="execution",
        resume=True,
    )
    mlx_max_microbatch_tokens: int = opt(
        8_192,
        NON_NEGATIVE,
        help="MLX: largest sub-batch (tokens) of a micro-batch",
        section="execution",
        resume=True,
    )
    mlx_eager_eval: bool = opt(
        True,
        ANY,
        help="MLX: evaluate the graph after every sub-batch (bounds memory on 16 GB Macs)",
        section="execution",
        resume=True,
    )
    collective_timeout_seconds: float = opt(
        300.0,
        NON_NEGATIVE,
        help="PyTorch, several ranks: a collective waiting longer fails the job; 0 = torch's 10-30 min",
        section="execution",
        resume=True,
    )
    memory_check: bool = opt(
        True,
        ANY,
        help="refuse to train when the estimated memory per device exceeds the device's (off: try anyway)",
        section="execution",
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
    def sliding_eval(self) -> bool:
        """Whether the final score also slides windows (core/eval/sliding.py) over the validation text:
        windows of eval_window tokens advancing by eval_stride overlap when 0 < eval_stride < eval_window."""
        return 0 < self.eval_stride < self.eval_window

    @property
    def max_doc_len(self) -> int:
        """Document-masked attention's longest segment: a document is cut every this many tokens from its
        start. No row pgolf makes is longer (training: train_seq_len, evaluation: eval_window), so within
        them only a row start and a BOS start a segment; a longer row is cut as the records' packed rows."""
        return max(self.train_seq_len, self.eval_window)

    @property
    def train_cap_seconds(self) -> float:
        """The training-time cap the loop and the schedules use: the wallclock cap less the time
        reserved for GPTQ's calibration; 0 = none."""
        if self.max_wallclock_seconds <= 0:
            return 0.0
        reserved = self.gptq_enabled or self.artifact_fit_bytes > 0
        return self.max_wallclock_seconds - (self.gptq_reserve_seconds if reserved else 0.0)

    def uses_compile(self, on_gpu: bool) -> bool:
        """Compile the step: when asked to, or by default on a GPU."""
        return self.compile == "on" or (self.compile == "auto" and on_gpu)

    def check_fields(self, names: Iterable[str] | None = None) -> Config:
        """Each field's own checks (its declaration's), of the fields `names` (default: all); raise
        PgolfError naming the first that fails; return self."""
        chosen = None if names is None else set(names)
        for f in fields(self):
            if chosen is not None and f.name not in chosen:
                continue
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise PgolfError(f"config: {f.name} must be finite, got {value}")
            for check in f.metadata["checks"]:
                if not check.ok(value):
                    raise PgolfError(f"config: {f.name} {check.rule}, got {value!r}")
        return self

    def validate(self, world_size: int = 1) -> Config:
        """Raise PgolfError naming the first inconsistent setting; return self.

        Each field's own checks (its declaration's) come first, then the rules between fields."""

        def require(ok: bool, message: str) -> None:
            if not ok:
                raise PgolfError(f"config: {message}")

        self.check_fields()
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
            self.eval_protocol != "flat" or self.varlen_attn_enabled,
            "eval_protocol=flat needs varlen_attn_enabled",
        )
        require(
            self.eval_stride <= self.eval_window,
            f"eval_stride={self.eval_stride} is longer than the evaluation window ({self.eval_window})",
        )
        for name in ("lqer_enabled", "gated_attn_quant_gate", "gptq_enabled"):
            require(
                not getattr(self, name) or self.quant_format == "mixed", f"{name} needs quant_format=mixed"
            )
        require(
            self.artifact_fit_margin == 0 or self.artifact_fit_bytes > 0,
            f"artifact_fit_margin={self.artifact_fit_margin} needs artifact_fit_bytes (the cap it aims under)",
        )
        require(
            self.artifact_fit_bytes <= self.budget_bytes,
            f"artifact_fit_bytes={self.artifact_fit_bytes:,} is over budget_bytes={self.budget_bytes:,}: an "
            "artifact fitted to it could not be submitted",
        )
        if self.gptq_enabled or self.artifact_fit_bytes > 0:
            require(self.gptq_calibration_batches > 0, "gptq_calibration_batches must be positive")
            require(
                self.max_wallclock_seconds <= 0 or self.train_cap_seconds > 0,
                f"gptq_reserve_seconds={self.gptq_reserve_seconds} leaves no training time under "
                f"max_wallclock_seconds={self.max_wallclock_seconds}",
            )
        require(
            self.rope_dims % 2 == 0 and self.rope_dims <= self.head_dim,
            f"rope_dims={self.rope_dims} must be even and at most head_dim={self.head_dim}",
        )
        require(
            not self.rope_yarn or (self.rope_dims or self.head_dim) > 2,
            f"rope_yarn needs more than 2 rotated dims (rope_dims, or head_dim={self.head_dim})",
        )
        require(int(self.mlp_mult * self.model_dim) >= 1, f"mlp_mult={self.mlp_mult} leaves the MLP no width")
        require(
            self.xsa_last_n <= self.num_layers,
            f"xsa_last_n={self.xsa_last_n} exceeds num_layers={self.num_layers}",
        )
        gates = [gate.field for gate in ATTENTION_GATES if getattr(self, gate.field)]
        require(len(gates) <= 1, f"{' and '.join(gates)}: one attention gate at a time")
        gate = self.attention_gate()
        windowed = self.smear_gate_enabled or (gate is not None and gate.windowed)
        require(
            not windowed or self.gate_window <= self.model_dim,
            f"gate_window={self.gate_window} exceeds model_dim={self.model_dim}",
        )
        require(
            self.bos_id < self.vocab_size,
            f"bos_id={self.bos_id} is not a token of vocab_size={self.vocab_size}",
        )
        layers = self.ve_layer_indices  # none when ve_enabled is off
        for i in layers:
            require(0 <= i < self.num_layers, f"ve_layers: layer {i} is not in 0..{self.num_layers - 1}")
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
                f"parallel_start_layer={psl} must be below num_layers={self.num_layers}",
            )
            # Once split, the stream is two lanes: a serial layer after that would read a stale x. Only
            # looping can reorder the decoder (without it, its layers come in increasing order).
            decoder = self.layer_layout(looping=True)[1]
            lanes = [i >= psl for i in decoder]
            require(
                lanes == sorted(lanes),
                f"parallel_start_layer={psl}: the decoder order {decoder} runs a layer below {psl} "
                "after a parallel one",
            )
        return self

    def layer_layout(self, looping: bool) -> tuple[list[int], list[int]]:
        """The physical layers the encoder and the decoder visit, in order.

        Looping (num_loops > 0 and switched on) repeats loop_start..loop_end so that the
        segment runs 1 + num_loops times; the visit list is then split in two halves,
        the encoder getting the shorter one when its length is odd.
        """
        order = list(range(self.num_layers))
        if looping and self.num_loops > 0:
            segment = slice(self.loop_start, self.loop_end + 1)
            order[segment] = order[segment] * (self.num_loops + 1)
        return order[: len(order) // 2], order[len(order) // 2 :]

    def attention_gate(self) -> AttentionGate | None:
        """The attention gate that is on (validation allows one at most), or None."""
        return next((gate for gate in ATTENTION_GATES if getattr(self, gate.field)), None)

    @property
    def ve_layer_indices(self) -> list[int]:
        """The layers that get the value embedding (empty when ve_enabled is off)."""
        # A config is validated before use, and ve_layers' own check (LAYER_LIST) makes each part a number.
        return [int(part) for part in self.ve_layers.split(",")] if self.ve_enabled else []

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, strict: bool = False) -> Config:
        """Build from a dict; unknown keys raise when strict, else are ignored (old checkpoints)."""
        unknown = sorted(set(data) - field_names())
        if strict and unknown:
            raise PgolfError(f"config: unknown key {unknown[0]!r}")
        return cls(**{k: _coerce(k, v) for k, v in data.items() if k not in unknown})

    def replace(self, **changes: Any) -> Config:
        return self.from_dict(self.to_dict() | changes, strict=True)


def field_names() -> set[str]:
    return {f.name for f in fields(Config)}


def _coerce(name: str, value: Any) -> Any:
    """Convert strings (env vars, flags) and TOML values to the field's type, with a clear error."""
    kind = type(Config.__dataclass_fields__[name].default)
    try:
        if isinstance(value, (list, dict, tuple)) or (isinstance(value, bool) and kind is not bool):
            raise ValueError(value)
        if isinstance(value, kind):
            return value
        text = str(value).strip()
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if re.fullmatch(r"[+-]?\d[\d_]*", text):  # exact, however large (a seed, say)
                return int(text)
            # 2e4 or 100.0: whole numbers only, read exactly (15999999.9999999999 is no whole number)
            number = Decimal(text.replace("_", ""))
            if not number.is_finite() or number.adjusted() > 40 or number != number.to_integral_value():
                raise ValueError(value)
            return int(number)
        if kind is float:
            return float(text.replace("_", ""))
        return str(value)
    except (ValueError, TypeError, OverflowError, InvalidOperation):
        shown = str(value) if isinstance(value, Decimal) else repr(value)
        raise PgolfError(f"config: {name} expects {kind.__name__}, got {shown}") from None


# What an artifact keeps (where it differs from the default) so that scoring it alone rebuilds the
# same model and evaluation: what the tensors' shapes do not tell. (The lists only the CLI's commands
# use, from `resume` and `section`, are core/config/sources.py's.)
SCORING_FIELDS = tuple(f.name for f in fields(Config) if f.metadata["scoring"])


# The records' environment names are the fields' names upper-cased; other scripts' names besides (the
# later records' VAL_BATCH_TOKENS is the baseline's VAL_BATCH_SIZE: tokens per evaluation step, all ranks).
ENV_ALIASES = {"TRAIN_MAX_SEQ_LEN": "train_seq_len", "VAL_BATCH_TOKENS": "val_batch_size"}


def env_names(environ: dict[str, str] | None = None) -> dict[str, str]:
    """{field: the environment variable that sets it} for the upstream variables present (e.g. MATRIX_LR);
    a field's own name wins over its alias."""
    env = os.environ if environ is None else environ
    aliased = {name: alias for alias, name in ENV_ALIASES.items() if alias in env}
    return aliased | {name: name.upper() for name in sorted(field_names()) if name.upper() in env}


def from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The upstream environment variables that name a config field (e.g. MATRIX_LR)."""
    env = os.environ if environ is None else environ
    return {name: env[var] for name, var in env_names(env).items()}
