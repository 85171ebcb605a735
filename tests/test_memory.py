"""Memory: configs that cannot fit any device refused before anything is allocated, the estimate by part,
and running out of memory (a step, test-time training) as one line naming the settings to lower."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from core.artifact.export import export_artifact
from core.common.errors import PgolfError, memory_hint
from core.config.fields import MAX_LAYERS
from core.config.presets import preset
from core.eval.bpb import EvalData
from core.eval.ttt import evaluate_ttt
from core.model import backend as backends
from core.model.memory import DeviceMemory, check_config, check_memory, memory_estimate
from core.model.params import count_params, init_params, storage_dtypes
from tests.support import ROOT
from tests.support.backends import BACKENDS, make_backend, needs
from tests.support.cli import assert_one_line_error, data_flags, python
from tests.support.ttt import LEGAL_CFG, unit_tables

H100 = DeviceMemory(80 * 2**30, "free memory of a test GPU", gpu=True)


# ------------------------------------------------- 2. configs that cannot fit any device
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_dim": 1_000_000_000}, "training needs about"),
        ({"train_batch_tokens": 1_073_741_824}, r"activations [\d,]+\.\d GiB"),
        ({"num_layers": 100_000_000}, f"num_layers must be at most {MAX_LAYERS}"),
    ],
)
def test_configs_that_cannot_fit_are_refused_before_anything_is_allocated(change, message):
    cfg = preset("baseline").replace(**change)
    with pytest.raises(PgolfError, match=message):
        cfg.validate()
        check_memory(cfg, H100)
    check_memory(cfg.replace(num_layers=9, memory_check=False), H100)  # the override


def test_the_published_configs_fit_an_80_gb_gpu_and_baseline_in_fp32_needs_more_than_16_gb():
    for name in ("baseline", "seq4096", "record_0401", "record_0427"):
        check_memory(preset(name), H100)
    with pytest.raises(PgolfError, match=r"but the test laptop is 16\.0 GiB"):
        check_memory(preset("baseline"), DeviceMemory(16 * 2**30, "test laptop", gpu=False))


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_says_how_much_memory_its_device_has(name):
    module = importlib.import_module(f"{backends.BACKENDS[name].package}.memory")
    device = module.device_memory(preset("smoke"))
    assert device.bytes > 2**28 and device.what
    check_config(name, preset("smoke"))  # what train and bench call


def test_the_estimate_by_part():
    cfg = preset("tiny")
    parts = memory_estimate(cfg, bf16=False)
    assert parts["params"] == 8 * count_params(cfg)
    assert parts["total"] == parts["params"] + parts["optimizer"] + parts["activations"]
    # Activations grow with the tokens of one forward, halve (all but the logits) in bf16,
    # and stop at a micro-batch however large a sub-batch may be.
    micro = cfg.train_batch_tokens // cfg.grad_accum_steps
    half = memory_estimate(cfg, bf16=False, forward_tokens=micro // 2)["activations"]
    assert 2 * half == parts["activations"]
    assert memory_estimate(cfg, bf16=False, forward_tokens=10 * micro) == parts
    logits = micro * 3 * cfg.vocab_size * 4
    assert memory_estimate(cfg, bf16=True)["activations"] - logits == (parts["activations"] - logits) // 2


# ------------------------------------------------- out of memory
def too_large(*args, **kwargs):
    """What PyTorch raises when an allocation fails (on the CPU: "DefaultCPUAllocator: can't allocate
    memory"), from a real allocation of 128 TiB."""
    import torch

    torch.empty(2**45, dtype=torch.float32)


@needs("cuda")
def test_out_of_memory_during_ttt_names_the_settings_to_lower(monkeypatch):
    from cuda_train.ttt import TorchTTT

    backend = make_backend("cuda", LEGAL_CFG)
    monkeypatch.setattr(TorchTTT, "score_then_adapt", too_large)
    tokens = np.random.default_rng(0).integers(3, LEGAL_CFG.vocab_size, 400).astype(np.int32)
    tokens[[0, 150, 300]] = LEGAL_CFG.bos_id
    try:
        with pytest.raises(PgolfError) as caught:
            evaluate_ttt(backend, EvalData(tokens, unit_tables(LEGAL_CFG.vocab_size)))
    finally:
        backend.close()
    message = str(caught.value)
    assert message.startswith("out of memory during test-time training (") and "\n" not in message
    assert message.endswith(
        "lower --ttt-batch-size, --ttt-lora-rank or --ttt-eval-seq-len (global phases: --global-ttt-batch-seqs)"
    )


@needs("cuda")
def test_memory_errors_and_only_they_become_one_line():
    import cli as cli_module

    try:
        too_large()
    except RuntimeError as exc:
        real = exc
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)")
    for exc in (MemoryError(), cuda, real):
        with (
            pytest.raises(PgolfError, match="out of memory during a step .*: lower --x"),
            memory_hint("a step", "--x"),
        ):
            raise exc
    with pytest.raises(RuntimeError, match="a bug"), memory_hint("a step", "--x"):
        raise RuntimeError("a bug")
    code, line = cli_module._ending(real)  # where no step names its settings
    assert code == 1 and line.startswith("error: out of memory (") and "lower" in line and "\n" not in line
    assert cli_module._ending(RuntimeError("a bug")) == (1, None)  # a traceback


@pytest.mark.slow  # a CLI eval that fills its memory
def test_eval_with_a_ttt_too_large_for_its_memory_is_one_line(sotu_dataset, tmp_path):
    """The reported case, LoRA adapters of rank 4096 for 64 documents, which failed under a 4 GB address
    space; here under 3 GB, which it fails the same way after filling less of it."""
    path = tmp_path / "a.pgolf"
    cfg = sotu_dataset.config("tiny")  # the tokenizer the artifact keeps is the one it is scored with
    export_artifact(init_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)
    result = python(
        ROOT / "cli.py", "eval", str(path), "--backend", "cuda", "--preset", "tiny", "--val-max-tokens", "8192",
        "--ttt-enabled", "--ttt-lora-rank", "4096", "--ttt-batch-size", "64", *data_flags(sotu_dataset),
        env=dict(os.environ), address_space=3_000_000_000,
    )  # fmt: skip
    assert_one_line_error(result, "error: out of memory during test-time training (", "--ttt-lora-rank")
