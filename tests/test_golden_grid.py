"""Records' own artifacts at a grid of shapes, scored by pgolf as the records score them.

tests/golden/make_record_eval_grid.py wrote each artifact with a record's own serialize path and scored
it with the record's own functions (its docstring lists the points): record 2026-04-01's deserialize +
eval_val and eval_val_sliding at MLP_MULT 3 and 4, VE_DIM below and above the kv width, tables through
its int8 path and passed through, the MLP through GPTQ int6 and passed through, sequences of 128 and
512, lzma and brotli; record 2026-04-27's deserialize + eval_val (one row a batch) at MLP_MULT 3 and
4, tok_emb through GPTQ int7 and passed through, the MLP through GPTQ int6 and passed through,
sequences of 128 and 512, lzma and brotli. Here each file is read and scored as `cli.py eval ARTIFACT` reads and
scores it given only the record's logged environment (its whole Hyperparameters block, with the point's
shape, compressor and batch in place of the logged run's; no preset, no pgolf-only name), in both
backends, in fp32 (the goldens' arithmetic): val_loss and val_bpb within 1e-6.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from core.artifact import mixed
from core.artifact.records import load_record_artifact
from core.datasets.writers import write_shard
from core.eval.score import evaluators
from core.runs.setup import weights_and_data
from tests.golden_data import GOLDEN
from tests.support.backends import BACKENDS, make_backend

GRID_0401 = GOLDEN / "record_eval_grid.json"
GRID_0427 = GOLDEN / "record_eval_grid_0427.json"
TOLERANCE = 1e-6


def read_grid(path: Path) -> dict:
    if not path.is_file():
        pytest.skip(f"golden file {path} is missing")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def grid_0401() -> dict:
    return read_grid(GRID_0401)


@pytest.fixture(scope="module")
def grid_0427() -> dict:
    return read_grid(GRID_0427)


def val_folder(tmp_path_factory, grid: dict) -> Path:
    """One validation shard of the tokens every point of a grid was scored on (and their byte sidecar)."""
    folder = tmp_path_factory.mktemp("grid_val")
    write_shard(folder / "fineweb_val_000000.bin", np.array(grid["val_tokens"], dtype=np.uint16))
    if "val_bytes" in grid:
        write_shard(folder / "fineweb_val_bytes_000000.bin", np.array(grid["val_bytes"], dtype=np.uint16))
    return folder


@pytest.fixture(scope="module")
def val_dir(grid_0401, tmp_path_factory) -> Path:
    return val_folder(tmp_path_factory, grid_0401)


@pytest.fixture(scope="module")
def val_dir_0427(grid_0427, tmp_path_factory) -> Path:
    return val_folder(tmp_path_factory, grid_0427)


LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun's variables, not settings: one process here


def logged_env(key: str) -> dict[str, str]:
    """Record `key`'s whole logged Hyperparameters block (tests/golden/make_record_eval_protocol.py read
    it from the record's train log), without the launcher's variables."""
    logged = json.loads((GOLDEN / "record_eval_protocol.json").read_text())["logged_env"][key]
    assert len(logged) > 60  # the whole block, not a few names
    return {k: v for k, v in logged.items() if k not in LAUNCH}


def score(
    artifact: Path, env: dict[str, str], backend_name: str, tokens: int, monkeypatch, kinds: tuple
) -> dict:
    """{"plain" | "sliding_window": (val_loss, val_bpb)} of a record's artifact as `cli.py eval ARTIFACT`
    scores it with no preset and no flag, given only the environment `env` (the shapes are read off the
    file, the preset from the record's own names); of the evaluations that config runs, `kinds` are scored."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    params, cfg, data = weights_and_data(artifact, None, None, {}, False)
    backend = make_backend(backend_name, cfg.replace(compute_dtype="float32"))  # the goldens' arithmetic
    backend.load_params(params)
    out = {}
    runs = evaluators(cfg)
    assert set(kinds) <= set(runs), (kinds, list(runs))
    for kind in kinds:
        meter = runs[kind](backend, data)
        assert meter.tokens == tokens - 1, kind
        out[kind] = (meter.val_loss, meter.val_bpb)
    return out


def score_0401_point(
    grid: dict, name: str, backend_name: str, data_path: Path, tokenizer: Path, monkeypatch
) -> dict:
    """One 2026-04-01 point: the record's logged environment with the point's shape and compressor."""
    s = grid["points"][name]["settings"]
    shape = {
        k.upper(): str(int(v) if isinstance(v, bool) else v) for k, v in s.items() if k != "embedding_dim"
    }
    env = (
        logged_env("0401")
        | shape
        | {
            "EVAL_BATCH_SEQS": str(grid["eval_batch_seqs"]),
            "COMPRESSOR": grid["points"][name]["compressor"],
            "DATA_PATH": str(data_path),
            "TOKENIZER_PATH": str(tokenizer),
        }
    )
    artifact = GOLDEN / "record_eval_grid" / f"{name}.ptz"
    return score(
        artifact, env, backend_name, len(grid["val_tokens"]), monkeypatch, ("plain", "sliding_window")
    )


def score_0427_point(
    grid: dict, name: str, backend_name: str, data_path: Path, tokenizer: Path, monkeypatch
) -> dict:
    """One 2026-04-27 point: the record's logged environment with the point's shape and compressor,
    batches of one row (as the golden's eval_val ran), no test-time training (the golden is its
    eval_val)."""
    point = grid["points"][name]["env"]
    env = (
        logged_env("0427")
        | point
        | {
            "VAL_BATCH_TOKENS": point["EVAL_SEQ_LEN"],
            "GRAD_ACCUM_STEPS": "1",
            "TTT_ENABLED": "0",
            "DATA_PATH": str(data_path),
            "TOKENIZER_PATH": str(tokenizer),
        }
    )
    artifact = GOLDEN / "record_eval_grid" / f"0427_{name}.ptz"
    # the record logs EVAL_STRIDE but runs no sliding evaluation: its eval_val is the plain figure
    return score(artifact, env, backend_name, len(grid["val_tokens"]), monkeypatch, ("plain",))


def assert_within(scores: dict, golden: dict, label: str) -> None:
    """Each score within TOLERANCE of the golden's; the differences printed (pytest -s shows them)."""
    for kind, (loss, bpb) in scores.items():
        d_loss, d_bpb = loss - golden[kind]["val_loss"], bpb - golden[kind]["val_bpb"]
        print(f"{label} {kind}: loss {d_loss:+.1e} bpb {d_bpb:+.1e}")
        assert abs(d_loss) <= TOLERANCE and abs(d_bpb) <= TOLERANCE, (kind, d_loss, d_bpb)


POINTS_0401 = ("gptq4_ve128", "gptq3_ve16", "gptq4_ve16", "pass4_ve16", "pass3_ve48", "int8_ve72")


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("point", POINTS_0401)
def test_record_0401_grid(point, backend_name, grid_0401, val_dir, challenge_dir, monkeypatch):
    golden = grid_0401["points"][point]
    tokenizer = challenge_dir / "fineweb_1024_bpe.model"
    scores = score_0401_point(grid_0401, point, backend_name, val_dir, tokenizer, monkeypatch)
    assert sorted(scores) == ["plain", "sliding_window"]
    assert_within(scores, golden, f"2026-04-01 {point} {backend_name}")


POINTS_0427 = ("gptq4_int7", "pass3_int7", "pass3_pass", "pass4_pass")


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("point", POINTS_0427)
def test_record_0427_grid(point, backend_name, grid_0427, val_dir_0427, challenge_dir, monkeypatch):
    golden = grid_0427["points"][point]
    tokenizer = challenge_dir / "fineweb_1024_bpe.model"
    scores = score_0427_point(grid_0427, point, backend_name, val_dir_0427, tokenizer, monkeypatch)
    assert sorted(scores) == ["plain"]
    assert_within(scores, golden, f"2026-04-27 {point} {backend_name}")


@pytest.mark.parametrize("point", POINTS_0427)
def test_record_0427_grid_weights_are_its_readers(point, grid_0427):
    """Each 2026-04-27 file read to the weights the record's deserialize gives, bit for bit."""
    weights = mixed.dequantize_mixed(load_record_artifact(GOLDEN / "record_eval_grid" / f"0427_{point}.ptz"))
    digests = grid_0427["points"][point]["weights_sha256"]
    assert sorted(weights) == sorted(digests)
    for name, digest in digests.items():
        assert hashlib.sha256(np.ascontiguousarray(weights[name]).tobytes()).hexdigest() == digest, name


def test_the_grids_take_each_setting_both_ways(grid_0401, grid_0427):
    """The points between them take each axis both ways (the forms are the records' own meta)."""
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

    points = grid_0427["points"]
    assert sorted(points) == sorted(POINTS_0427)

    def form(point: dict, name: str) -> str:
        return point["forms"][name].split(" ")[0]  # "gptq (int7)+lqer" -> "gptq"

    seen = {
        "mlp_mult": {float(p["env"]["MLP_MULT"]) for p in points.values()},
        "seq": {int(p["env"]["TRAIN_SEQ_LEN"]) for p in points.values()},
        "compressor": {p["env"]["COMPRESSOR"] for p in points.values()},
        "tok_emb": {form(p, "tok_emb.weight") for p in points.values()},
        "mlp": {form(p, "blocks.0.mlp.fc.weight") for p in points.values()},
    }
    assert seen == {
        "mlp_mult": {3.0, 4.0},
        "seq": {128, 512},
        "compressor": {"lzma", "brotli"},
        "tok_emb": {"gptq", "passthrough"},
        "mlp": {"gptq", "passthrough"},
    }
