"""The record presets against what the records' own logs say they ran.

tests/fixtures/record_0427_seed42_hparams.json is the `Hyperparameters:` block that record
2026-04-27's train_seed42.log prints (name -> the printed value), read once from the log.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from core.config.fields import Config
from core.config.presets import preset

LOGGED_0427 = Path(__file__).resolve().parent / "fixtures" / "record_0427_seed42_hparams.json"

# Logged fields whose preset value differs on purpose, and why.
DIFFERENT_0427 = {
    "grad_accum_steps": "the record's is per rank (1 on each of 8 GPUs); pgolf's counts all ranks' micro-batches",
    "eval_seq_len": "pgolf's 0 means train_seq_len (2048): compared as eval_window below",
    "tokenizer_path": "the record's machine's absolute path: compared by file name below",
    "eval_stride": "logged (64), but the record's script never reads it: it scores no sliding windows, nor does the preset",
    "seed": "a run's, not the recipe's",
    "run_id": "a run's, not the recipe's",
}


def logged_value(text: str, like):
    if isinstance(like, bool):
        assert text in ("True", "False"), text
        return text == "True"
    return type(like)(text)


def test_record_0427_is_the_logged_run():
    """Every hyperparameter the record's seed-42 log prints that is a pgolf field has the logged value
    in the preset, but for the differences listed (each with its reason)."""
    logged = json.loads(LOGGED_0427.read_text())
    cfg = preset("record_0427").validate(world_size=8)
    names = {f.name for f in fields(Config)}
    shared = sorted(names & set(logged))
    assert len(shared) > 90  # the model, optimizer, schedule, artifact, evaluation and TTT settings
    wrong = {
        k: (logged[k], getattr(cfg, k))
        for k in shared
        if k not in DIFFERENT_0427 and logged_value(logged[k], getattr(cfg, k)) != getattr(cfg, k)
    }
    assert not wrong, wrong
    assert cfg.eval_window == int(logged["eval_seq_len"])
    assert Path(cfg.tokenizer_path).name == Path(logged["tokenizer_path"]).name
    assert cfg.grad_accum_steps == int(logged["grad_accum_steps"]) * int(logged["world_size"])
    assert Path(cfg.data_path).name == Path(logged["datasets_dir"]).name


@pytest.mark.parametrize("name", ["record_0401_tiny", "record_0427_tiny"])
def test_tiny_record_presets_run_on_the_embedded_corpus(name):
    """The tiny versions read the embedded corpus (plain, or its CaseOps version for the CaseOps
    recipe), at the tiny preset's size."""
    cfg, tiny, full = preset(name), preset("tiny"), preset(name.removesuffix("_tiny"))
    assert (cfg.num_layers, cfg.model_dim, cfg.train_seq_len) == (
        tiny.num_layers,
        tiny.model_dim,
        tiny.train_seq_len,
    )
    assert cfg.caseops_enabled == full.caseops_enabled
    assert Path(cfg.data_path).name == ("sotu_sp1024_caseops" if full.caseops_enabled else "sotu_sp1024")
