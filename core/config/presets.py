"""The presets: named sets of config values, from the challenge's baseline to the records'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.common.errors import PgolfError, did_you_mean
from core.config.fields import Config

# Presets made for the challenge's FineWeb data (a warning when they run on the embedded corpus).
CHALLENGE_DATA_PRESETS = ("baseline", "seq4096", "record_0401", "record_0427")

# What records 2026-04-01 and 2026-04-27 share: 11 layers with a 4x leaky_relu(0.5)^2 MLP, XSA on every
# layer, partial RoPE, block-norm scaling, U-Net skip gates; 786,432 tokens of 2,048-token rows a step from
# the coprime loader; sliding windows at stride 64 (2026-04-27 logs the stride, but scores none); GPTQ int6
# matrices, byte-shuffled and brotli-compressed.
RECORD_STACK: dict[str, Any] = {
    "num_layers": 11,
    "mlp_mult": 4.0,
    "mlp_activation": "leaky_relu2",
    "xsa_last_n": 11,
    "rope_dims": 16,
    "ln_scale": True,
    "skip_gates_enabled": True,
    "train_seq_len": 2048,
    "train_batch_tokens": 786_432,
    "scalar_lr": 0.02,
    "tied_embed_lr": 0.03,
    "muon_momentum_warmup_start": 0.92,
    "muon_momentum_warmup_steps": 1500,
    "embed_wd": 0.085,
    "adam_wd": 0.02,
    "grad_clip_norm": 0.3,
    "train_loader": "coprime",
    "eval_stride": 64,
    "quant_format": "mixed",
    "matrix_bits": 6,
    "gptq_enabled": True,
    "compressor": "brotli",
    "byte_shuffle": 2,
}
RECORD_0401: dict[str, Any] = {
    **RECORD_STACK,
    "data_path": "data/datasets/fineweb10B_sp4096",
    "tokenizer_path": "data/tokenizers/fineweb_4096_bpe.model",
    "vocab_size": 4096,
    "ve_enabled": True,
    "ve_dim": 128,
    "ve_layers": "9,10",
    "qk_gain_init": 4.0,
    # Its model is cast to bf16, RoPE buffer included: positions, angles, cos and sin are bf16 too.
    "rope_precision": "bfloat16",
    "val_loss_every": 4000,
    "train_log_every": 500,
    "warmdown_frac": 0.667,
    "matrix_lr": 0.02,
    "muon_momentum": 0.99,
    "muon_wd": 0.085,
    "ema_decay": 0.997,
    # Its artifact: an int8 embedding beside the int6 GPTQ matrices; 10 s of the cap for GPTQ.
    "embed_bits": 8,
    "gptq_calibration_batches": 64,
    "gptq_reserve_seconds": 10.0,
}
# Record 2026-04-27 (val_bpb 1.0611, 3-seed mean), from its README and the hyperparameters its seed-42
# log prints. What pgolf cannot express is listed in docs/records.md ("Record 2026-04-27 as a preset").
RECORD_0427: dict[str, Any] = {
    **RECORD_STACK,
    "data_path": "data/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved",
    "tokenizer_path": "data/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model",
    "vocab_size": 8192,
    "caseops_enabled": True,
    # Its model is cast to bf16, so its RoPE inverse frequencies are rounded to bf16 (the rest is fp32).
    "rope_precision": "bf16_inv_freq",
    # The model, beyond the shared stack: layers 3..5 looped twice more from 35% of the run, two parallel
    # lanes from layer 8, SmearGate (masked at BOS) and the sparse attention gate on a 12-wide window.
    "qk_gain_init": 5.0,
    "num_loops": 2,
    "loop_start": 3,
    "loop_end": 5,
    "enable_looping_at": 0.35,
    "parallel_start_layer": 8,
    "parallel_final_lane": "mean",
    "smear_gate_enabled": True,
    "gate_window": 12,
    "sparse_attn_gate_enabled": True,
    "sparse_attn_gate_init_std": 0.0,
    "sparse_attn_gate_scale": 0.5,
    # Training, under the 10-minute cap (the default): Polar Express Muon with MuonEq-R, an LR floor.
    "val_loss_every": 0,
    "train_log_every": 500,
    "warmdown_frac": 0.85,
    "min_lr": 0.1,
    "matrix_lr": 0.026,
    "muon_momentum": 0.97,
    "muon_row_normalize": True,
    "muon_ns_coefficients": "polar_express",
    "muon_wd": 0.095,
    "beta2": 0.99,
    "ema_decay": 0.9965,
    # The artifact: SDClip at 12.85 sigmas (attention 13, MLP 11.5) and an int7 embedding (14), LQER
    # asymmetric int4 rank 4 on the top 3 tensors, the attention gate as int8 rows; the per-group lrzip
    # compressor (the lrzip program must be installed), pgolf's byte shuffle over its brotli part.
    "compressor": "pergroup",
    "embed_bits": 7,
    "matrix_clip_sigmas": 12.85,
    "embed_clip_sigmas": 14.0,
    "attn_clip_sigmas": 13.0,
    "mlp_clip_sigmas": 11.5,
    "gated_attn_quant_gate": True,
    "lqer_enabled": True,
    "lqer_rank": 4,
    "lqer_top_k": 3,
    "lqer_factor_bits": 4,
    "lqer_asym_enabled": True,
    "lqer_asym_group": 64,
    "gptq_calibration_batches": 16,
    "gptq_reserve_seconds": 0.5,
    # Evaluation: the plain figure, then phased LoRA TTT (rank 80, three global SGD phases over the
    # first 2,500 documents). No sliding windows: the record logs EVAL_STRIDE=64, but its script never
    # reads it and scores none (tests/test_golden_grid.py scores its artifact so).
    "eval_stride": 0,
    # Each document attends only within itself (the record's packed rows and cu_seqlens), in training,
    # evaluation and the global TTT phase.
    "varlen_attn_enabled": True,
    "global_ttt_respect_doc_boundaries": True,
    # Its plain figure (eval_val): flat batches of val_batch_size / grad_accum_steps tokens, one sequence
    # each, cut at every BOS and every eval_seq_len tokens of a document; the tail short of a batch is left out.
    "eval_protocol": "flat",
    "ttt_enabled": True,
    "ttt_mode": "lora",
    "ttt_lora_rank": 80,
    "ttt_lora_alpha": 144.0,
    "ttt_warm_start_a": True,
    "ttt_lora_lr": 1e-4,
    "ttt_chunk_size": 48,
    "ttt_eval_seq_len": 2048,
    "ttt_batch_size": 64,
    "ttt_grad_steps": 1,
    "ttt_beta1": 0.0,
    "ttt_beta2": 0.99,
    "ttt_weight_decay": 0.5,
    "ttt_optimizer": "adam",
    "phased_ttt_prefix_docs": 2500,
    "phased_ttt_num_phases": 3,
    "global_ttt_lr": 0.001,
    "global_ttt_momentum": 0.9,
    "global_ttt_epochs": 1,
    "global_ttt_chunk_tokens": 32768,
    "global_ttt_batch_seqs": 32,
    "global_ttt_grad_clip": 1.0,
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
    # 0.997 averages over ~330 steps, the whole of a 300-step run (docs/records.md); 0.95 over the last ~20.
    "ema_decay": 0.95,
}
# record_0427 scaled to the tiny model: the embedded corpus's CaseOps version, 4 layers; layers 1..2 loop,
# the last layer runs the two lanes, TTT windows of the training length; EMA as record_0401_tiny.
RECORD_0427_TINY_CHANGES: dict[str, Any] = {
    "data_path": "data/datasets/sotu_sp1024_caseops",
    "tokenizer_path": "data/tokenizers/sotu_1024_bpe_caseops.model",
    "vocab_size": 1024,
    "xsa_last_n": 4,
    "loop_start": 1,
    "loop_end": 2,
    "parallel_start_layer": 3,
    "ttt_eval_seq_len": 256,
    "muon_momentum_warmup_steps": 100,
    "ema_decay": 0.95,
    # brotli, not pergroup: it runs where lrzip is not installed (at this size only the embedding is int).
    "compressor": "brotli",
    # Flat evaluation batches of 1,024 tokens (4 rows): document-masked attention over a batch holds a
    # batch x batch mask, which at the tiny preset's 8,192 would be slow on a CPU.
    "val_batch_size": 2048,
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
    # Record 2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack (val_bpb 1.0611, 3-seed mean): its
    # model, optimizer, schedule, artifact (brotli in place of its per-group lrzip) and phased LoRA TTT.
    # Data: the CaseOps sp8192 shards (`data download --repo-id romeerp/parameter-golf-caseops-v1
    # --variant sp8192_lossless_caps_caseops_v1_reserved`).
    "record_0427": RECORD_0427,
    # The same recipe at the tiny preset's size, on the embedded corpus's CaseOps version
    # (`data prepare --caseops`).
    "record_0427_tiny": {**RECORD_0427, **TINY, **RECORD_0427_TINY_CHANGES},
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


# Names that only one record's script reads (its `Hyperparameters`), all of which its logged environment
# holds: weights that keep no settings of their own, given such an environment, are that record's and
# start from its preset, which holds what its script fixes without a name (the MLP's activation, document
# masking, its evaluation protocol, the precision of its RoPE tables).
RECORD_ENV_MARKS: dict[str, tuple[str, ...]] = {
    "record_0401": ("SLIDING_WINDOW_ENABLED", "GPTQ_ENABLED", "VE_ENABLED"),
    "record_0427": ("LQER_ENABLED", "SMEAR_GATE_ENABLED", "SPARSE_ATTN_GATE_ENABLED"),
}


def record_preset_of_env(environ: Mapping[str, str]) -> str | None:
    """The record preset whose marks (RECORD_ENV_MARKS) the environment holds, or None."""
    found = [name for name, marks in RECORD_ENV_MARKS.items() if all(m in environ for m in marks)]
    return found[0] if len(found) == 1 else None


def preset(name: str) -> Config:
    return Config().replace(**preset_values(name))


def preset_values(name: str) -> dict[str, Any]:
    """The fields a preset sets; an unknown name is refused with the nearest one suggested."""
    if name not in PRESETS:
        raise PgolfError(
            f"config: unknown preset {name!r}{did_you_mean(name, PRESETS)} (choose from {', '.join(PRESETS)})"
        )
    return PRESETS[name]
