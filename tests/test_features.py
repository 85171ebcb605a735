"""core/config/features.py: one predicate per optional feature decides both what a run's train_gpt.py holds
and which implementation the run picks."""

from __future__ import annotations

import numpy as np
import pytest

from core.artifact import export
from core.config import features
from core.config.features import FEATURES
from core.config.presets import preset
from core.data.coprime import CoprimeLoader
from core.datasets.writers import write_shard
from core.eval import score
from core.model import walk
from core.runs import train_script
from core.runs.train_script import bundled_modules, script
from core.train import loop

# Each feature's changes to `tiny` that turn it on, and that turn it off.
SWITCHES = {
    "test-time training": ({"ttt_enabled": True}, {}),
    "sliding windows": ({"eval_stride": 64}, {}),
    "test-time training's full mode": ({"ttt_enabled": True, "ttt_mode": "full"}, {"ttt_enabled": True}),
    "the tokenizer's byte tables": ({}, {"caseops_enabled": True}),
    "the per-group compressor": ({"compressor": "pergroup"}, {}),
    "the int8 format": ({}, {"quant_format": "mixed"}),
    "the mixed format": ({"quant_format": "mixed"}, {}),
    "GPTQ": ({"quant_format": "mixed", "gptq_enabled": True}, {"quant_format": "mixed"}),
    "the coprime loader": ({"train_loader": "coprime"}, {}),
    "the sequential loader": ({}, {"train_loader": "coprime"}),
    "LQER": ({"quant_format": "mixed", "lqer_enabled": True}, {"quant_format": "mixed"}),
    "FlashAttention's varlen kernel": ({"varlen_attn_enabled": True}, {}),
}


def test_every_feature_has_switches():
    assert set(SWITCHES) == {name for name, *_ in FEATURES}


@pytest.mark.slow
@pytest.mark.parametrize("feature", FEATURES, ids=lambda feature: feature[0])
def test_each_features_predicate_decides_its_bundle(feature, monkeypatch):
    name, modules, uses, field = feature
    on, off = (preset("tiny").replace(**changes).validate() for changes in SWITCHES[name])
    assert uses(on) and not uses(off)
    assert set(modules) <= set(bundled_modules(on))
    assert not set(modules) & set(bundled_modules(off))
    # The packaged script checks its config by the same predicate, reached by name in this module.
    assert getattr(features, uses.__name__) is uses
    assert f"features.{uses.__name__}, {field!r})" in script(off, compressed=False)
    # The table's predicate decides, not the config's fields: forced, it brings or drops the modules.
    for forced, cfg in ((True, off), (False, on)):
        table = tuple((n, m, (lambda cfg, f=forced: f) if n == name else u, fl) for n, m, u, fl in FEATURES)
        monkeypatch.setattr(train_script, "FEATURES", table)
        bundle = set(bundled_modules(cfg))
        assert set(modules) <= bundle if forced else not set(modules) & bundle


def test_the_code_that_picks_calls_the_predicate(monkeypatch, tmp_path):
    """Each predicate forced on, in the module that picks by it: the pick follows, whatever `tiny` says."""
    tiny = preset("tiny")  # none of these features on
    for module, name in (
        (score, "uses_ttt"),
        (score, "uses_sliding_windows"),
        (export, "uses_lqer"),
        (walk, "uses_varlen_attention"),
        (loop, "uses_coprime_loader"),
    ):
        assert getattr(module, name) is getattr(features, name)  # the one predicate, imported
        monkeypatch.setattr(module, name, lambda cfg: True)
    assert set(score.evaluators(tiny)) == {"plain", "sliding_window", "ttt"}
    assert export.lqer_settings(tiny) is not None
    assert walk.Walk(tiny).doc_mask
    files = [write_shard(tmp_path / "fineweb_train_000000.bin", np.arange(100))]
    assert isinstance(loop.make_train_loader(tiny, files), CoprimeLoader)
