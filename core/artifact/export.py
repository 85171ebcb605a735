"""A run's artifact: written in the format its config names, and read back.

Writing (`export_artifact`):
- `quant_format = "int8"`: the challenge's per-row int8 format (core/artifact/int8_format.py);
- `quant_format = "mixed"`: each tensor class at its own bits (`embed_bits`,
  `matrix_bits` or `attn_bits`/`mlp_bits`, `other_bits`; 16 keeps a class in fp16), the tensors
  of at most `*_passthrough_numel` values of each class kept in fp16 (the records: 65,536),
  the clip of each row by SDClip (k times the row's std, `*_clip_sigmas` > 0) or by
  the search over five percentiles, and GPTQ for every matrix whose input Hessian
  is given (core/artifact/mixed.py, core/artifact/gptq.py).
Either goes into pgolf's container, compressed with `compressor` after an optional
`byte_shuffle`. The report says where the bytes went, per tensor class (core/artifact/budget.py).

pgolf's containers also keep the settings the weights are scored with that their shapes
do not tell (the fields declared `scoring=True` in core/config/fields.py, where they differ
from the defaults: the model's switches, the sequence lengths, the evaluation, the dataset's
name), so an artifact can be scored alone (core/artifact/load.py: `saved_config`).

Reading (`read_pgolf_artifact`, then `dequantize`): pgolf's container in either format, as
a run reads back what it wrote; core/artifact/load.py reads every format pgolf knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.artifact import container
from core.artifact.int8_format import artifact_bytes, dequantize_int8, int8_from_container, quantize_int8
from core.artifact.lqer import LqerSettings
from core.artifact.mixed import (
    MixedModel,
    dequantize_mixed,
    mixed_artifact_bytes,
    mixed_from_container,
    quantize_mixed,
)
from core.artifact.quantized import CLIP_QUANTILE, CONTAINER_FORMAT, Int8Model, size_report
from core.artifact.rowquant import Clip
from core.common.errors import PgolfError, first_line
from core.common.files import file_sha256, read_file
from core.config.features import uses_gptq, uses_int8_format, uses_lqer
from core.config.fields import SCORING_FIELDS, Config
from core.model.params import artifact_classes

__all__ = [
    "ExportReport",
    "artifact_blob",
    "class_bits",
    "class_clips",
    "class_floors",
    "dequantize",
    "export_artifact",
    "from_container",
    "quant_label",
    "quantize_mixed_for",
    "read_pgolf_artifact",
    "tokenizer_digest",
]

FP16_BITS = 16  # a bits setting that keeps the class in fp16


def scoring_config(cfg: Config) -> dict[str, Any]:
    """The settings an artifact keeps: SCORING_FIELDS where `cfg` differs from the defaults."""
    defaults = Config()
    return {k: getattr(cfg, k) for k in SCORING_FIELDS if getattr(cfg, k) != getattr(defaults, k)}


def class_bits(cfg: Config) -> dict[str, int | str]:
    """The mixed format's bits per tensor class ("fp16" for a class kept in fp16)."""
    bits = {
        "embedding": cfg.embed_bits,
        "attention": cfg.attn_bits or cfg.matrix_bits,
        "mlp": cfg.mlp_bits or cfg.matrix_bits,
        "other": cfg.other_bits,
    }
    return {cls: "fp16" if b == FP16_BITS else b for cls, b in bits.items()}


def class_floors(cfg: Config) -> dict[str, int]:
    """The mixed format's floor per tensor class: its tensors of at most this many values stay in fp16."""
    return {
        "embedding": cfg.embed_passthrough_numel,
        "attention": cfg.attn_passthrough_numel,
        "mlp": cfg.mlp_passthrough_numel,
        "other": cfg.other_passthrough_numel,
    }


def class_clips(cfg: Config) -> dict[str, Clip]:
    """Each class's clip rule: SDClip at k std where its `*_clip_sigmas` is set; else, at 8 bits,
    the int8 format's percentile (as the records keep their int8 embedding), and below 8 bits
    the search over five percentiles (GPTQ-lite)."""
    sigmas = {
        "embedding": cfg.embed_clip_sigmas,
        "attention": cfg.attn_clip_sigmas or cfg.matrix_clip_sigmas,
        "mlp": cfg.mlp_clip_sigmas or cfg.matrix_clip_sigmas,
        "other": cfg.matrix_clip_sigmas,
    }
    bits = class_bits(cfg)

    return {
        cls: Clip.sdclip(k) if k > 0 else Clip.percentile(CLIP_QUANTILE) if bits[cls] == 8 else Clip()
        for cls, k in sigmas.items()
    }


def quant_label(cfg: Config) -> str:
    """The artifact's name in log lines: "int8", "int6" (the matrices' bits), or "mixed"."""
    if cfg.quant_format == "int8":
        return "int8"
    bits = class_bits(cfg)
    return f"int{bits['attention']}" if bits["attention"] == bits["mlp"] != "fp16" else "mixed"


@dataclass
class ExportReport:
    sizes: dict[str, int]  # size_report: payload, model, code, total, budget, headroom bytes
    gptq_tensors: int  # matrices rounded by GPTQ
    model: Int8Model | MixedModel  # what was written (its budget table: core/artifact/budget.py)


def lqer_settings(cfg: Config) -> LqerSettings | None:
    """The LQER corrections `cfg` asks for (mixed format), or None."""
    if not uses_lqer(cfg):
        return None
    return LqerSettings(
        cfg.lqer_rank, cfg.lqer_top_k, cfg.lqer_factor_bits, cfg.lqer_asym_enabled, cfg.lqer_asym_group
    )


def quantize_mixed_for(
    params: dict[str, np.ndarray],
    cfg: Config,
    dtypes: dict[str, str],
    hessians: dict[str, np.ndarray] | None = None,
) -> MixedModel:
    """The mixed-precision model `cfg`'s artifact settings make of `params` (GPTQ where `cfg` turns it
    on and `hessians` are given)."""
    return quantize_mixed(
        params,
        artifact_classes(cfg),
        class_bits(cfg),
        class_clips(cfg),
        hessians if uses_gptq(cfg) else None,
        dtypes,
        lqer=lqer_settings(cfg),
        quant_gate=cfg.gated_attn_quant_gate,
        floors=class_floors(cfg),
    )


def tokenizer_digest(cfg: Config) -> str | None:
    """The SHA-256 of `cfg`'s tokenizer file, which an artifact keeps (container.TOKENIZER_KEY); None when
    the file is not at hand (an export on another machine than the training)."""
    path = Path(cfg.tokenizer_path)
    return file_sha256(path, "tokenizer") if path.is_file() else None


def artifact_blob(model: Int8Model | MixedModel, cfg: Config) -> bytes:
    """The artifact file's bytes for `model` (either format) with `cfg`'s compressor, byte shuffle,
    scoring settings and tokenizer."""
    write = artifact_bytes if isinstance(model, Int8Model) else mixed_artifact_bytes
    return write(
        model,
        cfg.compressor,
        shuffle=cfg.byte_shuffle,
        config=scoring_config(cfg),
        tokenizer=tokenizer_digest(cfg),
    )


def export_artifact(
    params: dict[str, np.ndarray],
    cfg: Config,
    dtypes: dict[str, str],
    path: Path,
    code_bytes: int,
    hessians: dict[str, np.ndarray] | None = None,
    write: Any = None,  # (path, model) -> container.ArtifactInfo
    quantized: MixedModel | None = None,
) -> ExportReport:
    """Quantize `params` as `cfg` says, write the artifact to `path`, and report its size (where its
    bytes went, class by class: core/artifact/budget.py's `export_budget` of the report, `cfg` and `params`).

    `dtypes` are the storage dtypes of the weights in the model that trained them;
    `hessians` (name -> the Gram matrix of that weight's inputs) turn on GPTQ for those
    weights in the mixed format; `write` puts the model at `path` in another container than
    pgolf's (the CLI's upstream format: core/artifact/upstream.py's `save_upstream_torch`, int8
    only: core/runs/setup.py's `export_setup` refuses another format); `code_bytes` are the
    bytes counted as code (core.runs.train_script.code_bytes);
    `quantized`: the mixed model `quantize_mixed_for` already made of `params` with `cfg`.
    """
    if uses_int8_format(cfg):
        model, gptq = quantize_int8(params, dtypes, artifact_classes(cfg)), 0
    else:
        model = quantized or quantize_mixed_for(params, cfg, dtypes, hessians)
        gptq = sum(i.get("method") == "gptq" for i in model.info.values())
    if write:
        info = write(path, model)
    else:
        info = container.write_artifact(path, artifact_blob(model, cfg), cfg.compressor)
    # The payload: the bytes of every array it holds, LQER's factors (mixed format) included.
    parts = [model.quantized, model.scales, model.passthrough, *getattr(model, "lqer", {}).values()]
    payload = sum(a.nbytes for part in parts for a in part.values())
    sizes = size_report(payload, info.file_bytes, code_bytes, cfg.budget_bytes)
    return ExportReport(sizes, gptq, model)


# ------------------------------------------------------------------- reading
def from_container(box: container.Container) -> Int8Model | MixedModel:
    """The model of an opened pgolf container, in the format its metadata names, as pgolf wrote it (the
    readers of other files than a run's own check the container first: core/artifact/load.py)."""
    if box.meta["format"] == CONTAINER_FORMAT:
        return int8_from_container(box)
    return mixed_from_container(box)


def read_pgolf_artifact(path: str | Path) -> Int8Model | MixedModel:
    """A pgolf artifact, as `export_artifact` wrote it (core/artifact/load.py reads any format); damage
    is one PgolfError line naming it."""
    path = Path(path)
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    try:
        return from_container(container.open_container(blob))
    except PgolfError as exc:  # e.g. a compressor package that is not installed
        raise PgolfError(f"artifact {path}: {exc}") from None
    except Exception as exc:  # any decoding failure of a damaged file is a problem with the input
        raise PgolfError(f"artifact {path} is damaged: {first_line(exc)}") from None


def dequantize(model: Int8Model | MixedModel) -> dict[str, np.ndarray]:
    """float32 weights of either quantized model."""
    return dequantize_int8(model) if isinstance(model, Int8Model) else dequantize_mixed(model)
