"""Record 2026-04-27's evaluation protocol (`eval_protocol` flat) against the record's own `eval_val`.

tests/golden/make_record_eval_protocol.py ran the record's `eval_val` on its own artifact
(record_eval_0427.ptz) at five batch geometries (VAL_BATCH_TOKENS, EVAL_SEQ_LEN, GRAD_ACCUM_STEPS) and
world sizes 1 and 2; pgolf's `evaluate_flat` scores the same file and tokens alike within 1e-6. It also
keeps each record's logged hyperparameters: `cli.py eval` given only those (the model's shape and the
data's paths changed to the golden's) scores the goldens' artifacts as the records did.
"""

from __future__ import annotations

import json
import re
from functools import cache

import numpy as np
import pytest

from core.artifact.load import load_weights
from core.common.errors import PgolfError
from core.config.presets import record_preset_of_env
from core.config.sources import resolve
from core.data.tables import byte_tables
from core.data.tokenizer import load_tokenizer
from core.datasets.writers import write_shard
from core.eval.bpb import BPBMeter, EvalData
from core.eval.plain import evaluate, evaluate_flat
from core.runs.setup import scoring_config
from tests.golden_data import GOLDEN
from tests.support.backends import BACKENDS, make_backend, needs
from tests.support.cli import cli

PROTOCOL = GOLDEN / "record_eval_protocol.json"
ARTIFACT_0427 = GOLDEN / "record_eval_0427.ptz"


@cache
def protocol_golden() -> dict:
    return json.loads(PROTOCOL.read_text())


class RankOf:
    """A backend seen as rank `rank` of `world_size`, its sums left to the caller (who adds the ranks')."""

    def __init__(self, backend, rank: int, world_size: int):
        self._backend, self.rank, self.world_size = backend, rank, world_size

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)


def geometry(cfg, case: dict):
    """pgolf's config for one golden case: pgolf's grad_accum_steps counts every rank's micro-batches."""
    world = case["world_size"]
    return cfg.replace(
        val_batch_size=case["val_batch_tokens"],
        eval_seq_len=case["eval_seq_len"],
        grad_accum_steps=world * case["grad_accum_steps"],
    ).validate(world)


def scored_backend(backend_name: str, challenge_dir):
    """The golden artifact in a backend with the record_0427 preset and the golden's settings, and the
    golden's validation data."""
    golden = protocol_golden()
    cfg = resolve("record_0427", environ=golden["env"]).replace(ttt_enabled=False)
    assert cfg.eval_protocol == "flat"
    params, cfg = load_weights(ARTIFACT_0427, cfg)
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    tables = byte_tables(load_tokenizer(challenge_dir / "fineweb_1024_bpe.model"), cfg.vocab_size)
    return backend, cfg, EvalData(np.array(golden["val_tokens"]), tables, np.array(golden["val_bytes"]))


def assert_cases(backend, cfg, data, cases: list[dict]) -> None:
    """Each case: the tokens the record scored, its val_loss and val_bpb within 1e-6; world size 2 as
    two ranks of this one backend, their sums added as the all-reduce would."""
    for case in cases:
        backend.cfg = geometry(cfg, case)
        world = case["world_size"]
        sums = sum(evaluate_flat(RankOf(backend, r, world), data).as_array() for r in range(world))
        meter = BPBMeter.from_array(sums)
        assert meter.tokens == case["tokens"], case
        assert meter.val_loss == pytest.approx(case["val_loss"], abs=1e-6), case
        assert meter.val_bpb == pytest.approx(case["val_bpb"], abs=1e-6), case


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_flat_batches_are_the_records_eval_val(backend_name, challenge_dir):
    """One geometry (batches of 512 tokens cut every 64, two micro-batches) on one and two ranks; pgolf's
    rows on the same tokens give another figure (so the comparison can fail)."""
    cases = [c for c in protocol_golden()["cases"] if c["eval_seq_len"] == 64]
    assert {c["world_size"] for c in cases} == {1, 2}
    backend, cfg, data = scored_backend(backend_name, challenge_dir)
    assert_cases(backend, cfg, data, cases)
    backend.cfg = geometry(cfg, cases[0])
    rows = evaluate(backend, data)
    assert abs(rows.val_bpb - cases[0]["val_bpb"]) > 1e-5
    backend.cfg = cfg.replace(val_batch_size=len(data.tokens) + cfg.eval_window, grad_accum_steps=1)
    with pytest.raises(PgolfError, match="hold no whole batch of"):
        evaluate_flat(backend, data)


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_flat_batches_are_the_records_eval_val_at_every_geometry(backend_name, challenge_dir):
    """Every golden geometry (five) at world sizes 1 and 2."""
    cases = protocol_golden()["cases"]
    assert len(cases) >= 6 and {c["world_size"] for c in cases} == {1, 2}
    assert_cases(*scored_backend(backend_name, challenge_dir), cases)


# ------------------------------------------------------------ a record's settings alone
ARTIFACT_SETTINGS = ("compressor",)  # how the golden file was written, where the log's run wrote otherwise
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun's, not settings: one process here


def logged_environment(key: str, shape: dict[str, str], tmp_path, tokenizer) -> dict[str, str]:
    """Record `key`'s logged hyperparameters as the environment, with the golden's model shape and
    artifact settings in place of the logged run's, the data and tokenizer paths at the test's files,
    and the launcher's variables left to the launcher."""
    env = {k: v for k, v in protocol_golden()["logged_env"][key].items() if k not in LAUNCH}
    assert len(env) > 60  # the whole block, not a few names
    return {**env, **shape, "DATA_PATH": str(tmp_path), "TOKENIZER_PATH": str(tokenizer)}


def eval_with_env(
    artifact, env: dict[str, str], backend_name: str, tmp_path
) -> dict[str, tuple[float, float]]:
    result = cli("eval", str(artifact), "--backend", backend_name, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    found = re.findall(r"eval:(\w+) tokens:\d+ val_loss:([\d.]+) val_bpb:([\d.]+)", result.stdout)
    return {kind: (float(loss), float(bpb)) for kind, loss, bpb in found}


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_record_0427_logged_settings_alone_score_its_artifact(backend_name, tmp_path, challenge_dir):
    """Record 2026-04-27's logged Hyperparameters (LQER_ENABLED among them, no pgolf-only name) at the
    golden's shapes and batch geometry: `cli.py eval` of its artifact gives its eval_val figure."""
    golden = protocol_golden()
    case = golden["cases"][0]
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array(golden["val_tokens"], dtype=np.uint16))
    write_shard(tmp_path / "fineweb_val_bytes_000000.bin", np.array(golden["val_bytes"], dtype=np.uint16))
    shape = {k: v for k, v in golden["env"].items() if k not in ("LQER_ENABLED",)}
    shape |= {"VAL_BATCH_TOKENS": str(case["val_batch_tokens"]), "GRAD_ACCUM_STEPS": str(case["grad_accum_steps"]),
              "EVAL_SEQ_LEN": str(case["eval_seq_len"]), "TTT_ENABLED": "0"}  # fmt: skip
    env = logged_environment("0427", shape, tmp_path, challenge_dir / "fineweb_1024_bpe.model")
    assert env["LQER_ENABLED"] == "1" and env["COMPRESSOR"] == "brotli"
    scores = eval_with_env(ARTIFACT_0427, env, backend_name, tmp_path)
    assert scores["plain"][0] == pytest.approx(case["val_loss"], abs=1e-6)
    assert scores["plain"][1] == pytest.approx(case["val_bpb"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_record_0401_logged_settings_alone_score_its_artifact(backend_name, tmp_path, challenge_dir):
    """Record 2026-04-01's logged Hyperparameters (GPTQ_ENABLED among them) at the golden's shapes:
    `cli.py eval` of its artifact (tests/golden/make_record_eval.py) gives its eval_val and
    eval_val_sliding figures."""
    golden = json.loads((GOLDEN / "record_eval.json").read_text())
    s = golden["settings"]
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array(golden["val_tokens"], dtype=np.uint16))
    shape = {
        k.upper(): str(int(v) if isinstance(v, bool) else v)
        for k, v in s.items()
        if k not in ("embedding_dim",)
    }
    shape |= {"EVAL_BATCH_SEQS": str(golden["eval_batch_seqs"]), "COMPRESSOR": "lzma"}
    env = logged_environment("0401", shape, tmp_path, challenge_dir / "fineweb_1024_bpe.model")
    assert env["GPTQ_ENABLED"] == "1" and env["SLIDING_WINDOW_ENABLED"] == "1"
    scores = eval_with_env(GOLDEN / "record_eval.ptz", env, backend_name, tmp_path)
    assert sorted(scores) == ["plain", "sliding_window"]
    for kind, (loss, bpb) in scores.items():
        assert loss == pytest.approx(golden[kind]["val_loss"], abs=1e-6), kind
        assert bpb == pytest.approx(golden[kind]["val_bpb"], abs=1e-6), kind


def test_a_records_logged_environment_names_its_preset():
    """Each record's logged block starts scoring from its own preset; an environment holding both
    records' marks, or neither's, from none."""
    logged = protocol_golden()["logged_env"]
    assert record_preset_of_env(logged["0401"]) == "record_0401"
    assert record_preset_of_env(logged["0427"]) == "record_0427"
    assert record_preset_of_env({**logged["0401"], **logged["0427"]}) is None
    assert record_preset_of_env({"NUM_LAYERS": "11", "LQER_ENABLED": "1"}) is None


def test_how_an_artifact_was_written_plays_no_part_in_scoring_it():
    """LQER, GPTQ and the attention gate's int8 rows asked for over a format without them (refused by
    training and export: `lqer_enabled needs quant_format=mixed`) are no obstacle to scoring."""
    writing = {
        "lqer_enabled": True,
        "gptq_enabled": True,
        "gated_attn_quant_gate": True,
        "quant_format": "int8",
    }
    with pytest.raises(PgolfError, match="needs quant_format=mixed"):
        resolve("smoke", overrides=writing).validate()
    _, cfg = scoring_config(ARTIFACT_0427, "smoke", None, writing)
    assert (cfg.lqer_enabled, cfg.gptq_enabled) == (False, False)


@needs("cuda")
@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "NUM_LAYERS",
            "11",
            "config: num_layers=11 (env NUM_LAYERS), but {} holds weights with num_layers=2",
        ),
        ("MLP_MULT", "4.0", "config: mlp_mult=4.0 (env MLP_MULT), but {} holds weights with mlp_mult=17.0"),
        (
            "COMPRESSOR",
            "pergroup",
            "config: compressor='pergroup' (env COMPRESSOR), but {} is brotli-compressed",
        ),
    ],
)
def test_a_setting_the_file_contradicts_is_one_line_naming_both(name, value, message, tmp_path):
    env = {**protocol_golden()["env"], name: value, "DATA_PATH": str(tmp_path)}
    result = cli("eval", str(ARTIFACT_0427), "--backend", "cuda", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: " + message.format(ARTIFACT_0427)
