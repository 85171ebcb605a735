"""What a packaged training run holds: the modules of the training path, and the features only some runs
use, each with the one test of a config that says whether a run uses it.

The code that picks an implementation calls these predicates, and core/runs/train_script.py bundles exactly
the training path's modules and those of the features a run's config uses into its `train_gpt.py`, by
the same predicates, which the packaged script checks again after the environment's overrides: what a
run uses and what its script holds cannot disagree. A module a bundled one imports must be on one of
these lists: the packager refuses any other, naming the imports that reach it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config.fields import Config


# The modules every packaged run holds: the config, the training loop, the data it reads, the model, the
# optimizers, the run's artifact and its scoring, and the PyTorch backend (with their packages).
TRAINING_PATH = (
    "core.common.compress", "core.common.errors", "core.common.files", "core.common.launch",
    "core.config.features", "core.config.fields",
    "core.data.shards", "core.data.tokenizer",
    "core.model.optim", "core.model.params", "core.model.schedule", "core.model.walk",
    "core.artifact.container", "core.artifact.export", "core.artifact.quantized",
    "core.eval.bpb", "core.eval.plain", "core.eval.score",
    "core.train.loop", "core.train.rundir",
    "cuda_train.backend", "cuda_train.model", "cuda_train.optim",
)  # fmt: skip


# Settings only pgolf's `train` acts on (starting from other weights, the artifact fit, trackers, the stop
# behind a reference run: core/train/managed.py): a packaged script refuses them before it starts.
PGOLF_ONLY = ("init_from", "artifact_fit_bytes", "report_to", "abort_behind")


def uses_ttt(cfg: Config) -> bool:
    return cfg.ttt_enabled


def uses_sliding_windows(cfg: Config) -> bool:
    return cfg.sliding_eval


def uses_full_ttt(cfg: Config) -> bool:
    return uses_ttt(cfg) and cfg.ttt_mode == "full"


def uses_byte_tables(cfg: Config) -> bool:
    """Data with a validation byte sidecar (CaseOps, or a tokenizer whose tables would miscount) counts
    its bytes from it; every other run from the tokenizer's tables."""
    return not cfg.caseops_enabled


def uses_pergroup(cfg: Config) -> bool:
    return cfg.compressor == "pergroup"


def uses_int8_format(cfg: Config) -> bool:
    return cfg.quant_format == "int8"


def uses_mixed_format(cfg: Config) -> bool:
    return cfg.quant_format == "mixed"


def uses_gptq(cfg: Config) -> bool:
    return cfg.gptq_enabled


def uses_coprime_loader(cfg: Config) -> bool:
    return cfg.train_loader == "coprime"


def uses_sequential_loader(cfg: Config) -> bool:
    return cfg.train_loader == "sequential"


def uses_lqer(cfg: Config) -> bool:
    return cfg.lqer_enabled


def uses_varlen_attention(cfg: Config) -> bool:
    """Document-masked attention: on CUDA, FlashAttention's varlen kernel."""
    return cfg.varlen_attn_enabled


# (feature, its modules, the predicate, the field that asks for it). A run's bundle holds the modules of
# those its config uses; a left-out one is a stand-in there that refuses to be used.
FEATURES = (
    ("test-time training", ("core.eval.ttt", "core.model.lora", "cuda_train.ttt"), uses_ttt, "ttt_enabled"),
    ("sliding windows", ("core.eval.sliding",), uses_sliding_windows, "eval_stride"),
    # The full mode's code is test-time training's; it scores in sliding windows.
    ("test-time training's full mode", ("core.eval.sliding",), uses_full_ttt, "ttt_mode"),
    ("the tokenizer's byte tables", ("core.data.tables",), uses_byte_tables, "caseops_enabled"),
    ("the per-group compressor", ("core.common.pergroup",), uses_pergroup, "compressor"),
    ("the int8 format", ("core.artifact.int8_format",), uses_int8_format, "quant_format"),
    ("the mixed format", ("core.artifact.mixed", "core.artifact.rowquant"), uses_mixed_format, "quant_format"),
    ("GPTQ", ("core.artifact.gptq", "core.train.calibration"), uses_gptq, "gptq_enabled"),
    ("the coprime loader", ("core.data.coprime",), uses_coprime_loader, "train_loader"),
    ("the sequential loader", ("core.data.sequential",), uses_sequential_loader, "train_loader"),
    ("LQER", ("core.artifact.lqer",), uses_lqer, "lqer_enabled"),
    ("FlashAttention's varlen kernel", ("cuda_train.varlen",), uses_varlen_attention, "varlen_attn_enabled"),
)  # fmt: skip
