"""`init_from`: a run that starts from given weights (a checkpoint, a safetensors file, a torch state
dict with the records' names) with a fresh optimizer at step 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from core.artifact.load import RECORD_BANKS, load_checkpoint, load_init_weights
from core.common.errors import PgolfError
from core.config.presets import preset
from core.model.params import init_params
from tests.support.backends import BACKENDS
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import final_params, run


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_run_from_a_checkpoint_starts_with_exactly_its_weights(sotu_dataset, backend_name, tmp_path):
    """Step 0's checkpoint of a run started from another run's last checkpoint holds that checkpoint's
    weights bit for bit (after the warm-up steps, which are undone), and no optimizer history."""
    first = run(sotu_dataset, backend_name, tmp_path, "first", iterations=2)
    source = sorted((first.run_dir / "checkpoints").glob("*.safetensors"))[-1]
    started = run(
        sotu_dataset, backend_name, tmp_path, "started", iterations=0, warmup_steps=2, init_from=str(source)
    )
    ckpt = load_checkpoint(started.run_dir / "checkpoints" / "step_000000.safetensors")
    expected = load_checkpoint(source).params
    assert ckpt.params.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(ckpt.params[name], value, err_msg=name)
    assert ckpt.step == 0 and int(ckpt.optimizer["step"]) == 0
    assert not any(np.any(v) for k, v in ckpt.optimizer.items() if k.startswith(("exp_avg", "momentum")))
    assert json.loads((started.run_dir / "config.json").read_text())["init_from"] == str(source)
    assert f"init_from:{source}" in (started.run_dir / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_run_from_its_own_init_is_the_seeded_run(sotu_dataset, backend_name, tmp_path):
    """A run from a safetensors file of seed 1337's initial weights, under another seed, trains exactly
    as the run seeded 1337: the optimizer starts fresh and the schedules start at step 0."""
    cfg = sotu_dataset.config("smoke")
    path = tmp_path / "init.safetensors"
    save_file(init_params(cfg), str(path))
    seeded = run(sotu_dataset, backend_name, tmp_path, "seeded", iterations=3)
    started = run(sotu_dataset, backend_name, tmp_path, "started", iterations=3, seed=7, init_from=str(path))
    a, b = final_params(seeded), final_params(started)
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def test_a_torch_state_dict_with_the_records_names_and_banks(tmp_path):
    """A record's final_model.pt: its banks split into pgolf's per-layer matrices, a compiled model's
    name prefix dropped, a bf16 table read as its float32 values."""
    torch = pytest.importorskip("torch")
    cfg = preset("smoke")
    params = init_params(cfg)
    n = cfg.num_layers
    state = {}
    for name, value in params.items():
        if not any(name.endswith(part) for parts in RECORD_BANKS.values() for part in parts):
            state[f"_orig_mod.{name}"] = torch.from_numpy(value.copy())
    for bank, parts in RECORD_BANKS.items():
        state[bank] = torch.from_numpy(np.stack([params[f"blocks.{i}.{p}"] for p in parts for i in range(n)]))
    state["_orig_mod.tok_emb.weight"] = state["_orig_mod.tok_emb.weight"].bfloat16()
    torch.save(state, tmp_path / "final_model.pt")
    got = load_init_weights(tmp_path / "final_model.pt", cfg)
    assert got.keys() == params.keys()
    for name, value in params.items():
        expected = torch.from_numpy(value).bfloat16().float().numpy() if name == "tok_emb.weight" else value
        np.testing.assert_array_equal(got[name], expected, err_msg=name)


def test_mismatched_weights_are_refused_naming_the_tensor(tmp_path):
    cfg = preset("smoke")
    params = init_params(cfg)
    cases = {
        "shape": (
            {**params, "blocks.1.mlp.fc.weight": np.zeros((3, 64), np.float32)},
            "blocks.1.mlp.fc.weight",
        ),
        "extra": ({**params, "bigram.weight": np.zeros(4, np.float32)}, "unexpected tensor 'bigram.weight'"),
        "missing": (
            {k: v for k, v in params.items() if k != "skip_weights"},
            "missing tensor 'skip_weights'",
        ),
        "nan": ({**params, "skip_weights": np.full_like(params["skip_weights"], np.nan)}, "skip_weights"),
    }
    for case, (tensors, fragment) in cases.items():
        path = tmp_path / f"{case}.safetensors"
        save_file(tensors, str(path))
        with pytest.raises(PgolfError, match="init_from") as info:
            load_init_weights(path, cfg)
        assert fragment in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "junk.pt").write_bytes(b"neither safetensors nor torch")
    with pytest.raises(PgolfError, match="not a pgolf checkpoint, a safetensors file or a torch state dict"):
        load_init_weights(tmp_path / "junk.pt", cfg)


def test_the_cli_refuses_a_mismatch_in_one_line(sotu_dataset, tmp_path):
    cfg = preset("smoke")
    params = {**init_params(cfg), "blocks.0.attn.c_q.weight": np.zeros((64, 32), np.float32)}
    save_file(params, str(tmp_path / "w.safetensors"))
    result = cli("train", "--preset", "smoke", "--out-dir", str(tmp_path / "runs"), *data_flags(sotu_dataset),
                 "--init-from", str(tmp_path / "w.safetensors"))  # fmt: skip
    assert_one_line_error(result, "init_from", "blocks.0.attn.c_q.weight")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
