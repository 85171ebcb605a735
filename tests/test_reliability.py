"""Issue 14, one section per failure: each test here failed (a traceback, a hang, a wrong
acceptance) before the fix it names."""

from __future__ import annotations

import pytest

from core.backend import DeviceMemory, check_memory
from core.config import MAX_LAYERS, SEED_MAX, load_toml, preset, resolve
from core.errors import PgolfError
from core.params import count_params, memory_estimate

H100 = DeviceMemory(80 * 2**30, "free memory of a test GPU", gpu=True)


# ------------------------------------------------- 1. seeds outside what the frameworks take
@pytest.mark.parametrize("seed", ["-1", str(2**64 + 1), str(SEED_MAX + 1)])
def test_seeds_out_of_range_are_refused_from_flags_env_and_toml(tmp_path, seed):
    toml = tmp_path / "c.toml"
    toml.write_text(f"seed = {seed}\n")
    for cfg in (
        resolve("smoke", overrides={"seed": seed}),
        resolve("smoke", environ={"SEED": seed}),
        resolve("smoke", toml_path=toml, environ={}),
    ):
        with pytest.raises(PgolfError, match=f"seed must be in 0..{SEED_MAX}"):
            cfg.validate()
    assert load_toml(toml)["seed"] == int(seed)


def test_the_ends_of_the_seed_range_are_accepted():
    for seed in (0, SEED_MAX):
        assert preset("smoke").replace(seed=seed).validate().seed == seed


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
    for name in ("baseline", "seq4096", "record_0401"):
        check_memory(preset(name), H100)
    with pytest.raises(PgolfError, match=r"but the test laptop is 16\.0 GiB"):
        check_memory(preset("baseline"), DeviceMemory(16 * 2**30, "test laptop", gpu=False))


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
