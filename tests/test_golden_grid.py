"""Records' own artifacts at a grid of shapes, scored by pgolf as the records score them.

tests/golden/make_record_eval_grid.py wrote each artifact with record 2026-04-01's own serialize path
and scored it with its deserialize + eval_val and eval_val_sliding (its docstring lists the points:
MLP_MULT 3 and 4, VE_DIM below and above the kv width, tables through the int8 path and passed
through, sequences of 128 and 512, lzma and brotli). Here each file is read and scored as `cli.py eval
--preset record_0401` reads and scores it, in both backends: val_loss and val_bpb within 1e-6.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.datasets.writers import write_shard
from core.eval.score import evaluators
from core.runs.setup import weights_and_data
from tests.test_backends import BACKENDS, make_backend

GOLDEN = Path(__file__).resolve().parent / "golden"
GRID_0401 = GOLDEN / "record_eval_grid.json"
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def grid_0401() -> dict:
    if not GRID_0401.is_file():
        pytest.skip(f"golden file {GRID_0401} is missing")
    return json.loads(GRID_0401.read_text())


@pytest.fixture(scope="module")
def val_dir(grid_0401, tmp_path_factory) -> Path:
    """One validation shard, the tokens every point was scored on."""
    folder = tmp_path_factory.mktemp("grid_val")
    write_shard(folder / "fineweb_val_000000.bin", np.array(grid_0401["val_tokens"], dtype=np.uint16))
    return folder


def score_0401_point(grid: dict, name: str, backend_name: str, data_path: Path, tokenizer: Path) -> dict:
    """{"plain" | "sliding_window": (val_loss, val_bpb)} of one grid point's artifact, by the record_0401
    preset with the point's settings that its file does not hold (the shapes are read off the file)."""
    s = grid["points"][name]["settings"]
    names = ("vocab_size", "train_seq_len", "eval_stride", "rope_dims", "ve_dim", "ve_layers", "xsa_last_n")
    overrides = {k: s[k] for k in names} | {
        "eval_batch_seqs": grid["eval_batch_seqs"],
        "data_path": str(data_path),
        "tokenizer_path": str(tokenizer),
    }
    params, cfg, data = weights_and_data(
        GOLDEN / "record_eval_grid" / f"{name}.ptz", "record_0401", None, overrides, False
    )
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    out = {}
    for kind, evaluator in evaluators(cfg).items():
        meter = evaluator(backend, data)
        assert meter.tokens == len(grid["val_tokens"]) - 1, kind
        out[kind] = (meter.val_loss, meter.val_bpb)
    return out


POINTS_0401 = ("gptq4_ve128", "gptq3_ve16", "gptq4_ve16", "pass4_ve16", "pass3_ve48", "int8_ve72")


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("point", POINTS_0401)
def test_record_0401_grid(point, backend_name, grid_0401, val_dir, challenge_dir):
    golden = grid_0401["points"][point]
    scores = score_0401_point(
        grid_0401, point, backend_name, val_dir, challenge_dir / "fineweb_1024_bpe.model"
    )
    assert sorted(scores) == ["plain", "sliding_window"]
    for kind, (loss, bpb) in scores.items():
        assert abs(loss - golden[kind]["val_loss"]) <= TOLERANCE, (kind, loss - golden[kind]["val_loss"])
        assert abs(bpb - golden[kind]["val_bpb"]) <= TOLERANCE, (kind, bpb - golden[kind]["val_bpb"])


def test_the_grid_takes_each_setting_both_ways(grid_0401):
    """The points between them take each axis both ways (the forms are the record's own meta)."""
    points = grid_0401["points"]
    assert sorted(points) == sorted(POINTS_0401)

    def kv_width(s):
        return s["num_kv_heads"] * s["model_dim"] // s["num_heads"]

    seen = {
        "mlp_mult": {p["settings"]["mlp_mult"] for p in points.values()},
        "ve_above_kv": {p["settings"]["ve_dim"] > kv_width(p["settings"]) for p in points.values()},
        "seq": {p["settings"]["train_seq_len"] for p in points.values()},
        "compressor": {p["compressor"] for p in points.values()},
        "tok_emb": {p["forms"]["tok_emb.weight"] for p in points.values()},
        "ve_embed": {p["forms"]["ve_shared.embed.weight"] for p in points.values()},
        "mlp": {p["forms"]["blocks.0.mlp.fc.weight"] for p in points.values()},
    }
    assert seen == {
        "mlp_mult": {3.0, 4.0},
        "ve_above_kv": {False, True},
        "seq": {128, 512},
        "compressor": {"lzma", "brotli"},
        "tok_emb": {"int8", "passthrough"},
        "ve_embed": {"int8", "passthrough"},
        "mlp": {"int6", "passthrough"},
    }
