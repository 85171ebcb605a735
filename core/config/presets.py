"""The presets: named sets of config values, from the challenge's baseline to the records'."""

from __future__ import annotations

from typing import Any

from core.common.errors import PgolfError, did_you_mean
from core.config.fields import Config

# Presets made for the challenge's FineWeb data (a warning when they run on the embedded corpus).
CHALLENGE_DATA_PRESETS = ("baseline", "seq4096", "record_0401")

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
