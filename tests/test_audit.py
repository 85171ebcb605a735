"""`audit`: an evaluation that learns before it scores, or reads past its target, fails; pgolf's own pass."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from core.config.fields import Config
from core.config.presets import preset
from core.eval.bpb import EvalData
from core.eval.plain import evaluate
from core.eval.sliding import evaluate_sliding
from core.eval.ttt import evaluate_ttt
from core.runs.audit import (
    Swap,
    check_calibration,
    compare,
    perturbed_scores,
    swap_document,
)
from tests.support.backends import BACKENDS, busy_params, make_backend, needs
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import fake_run, made_audit
from tests.support.ttt import LEGAL_CFG, AdaptsFirst, stream, unit_tables

PLAIN_CFG = preset("smoke").replace(eval_seq_len=16)
SLIDING_CFG = PLAIN_CFG.replace(eval_stride=4, eval_batch_seqs=4)
FULL_CFG = PLAIN_CFG.replace(
    ttt_enabled=True, ttt_mode="full", ttt_chunk_tokens=48, ttt_lr=0.05, ttt_epochs=1, ttt_batch_seqs=2,
    eval_stride=8, eval_batch_seqs=2,
)  # fmt: skip
CASES = {
    "plain": (PLAIN_CFG, evaluate),
    "sliding": (SLIDING_CFG, evaluate_sliding),
    "ttt_lora_phased": (LEGAL_CFG, evaluate_ttt),
    "ttt_full": (FULL_CFG, evaluate_ttt),
}


def data() -> EvalData:
    tokens = stream()[: 12 * 16 + 1]  # whole evaluation sequences of 16, plus the last target
    return EvalData(tokens, unit_tables(1024))


def run(backend, cfg, evaluator):
    return perturbed_scores(backend, busy_params(cfg, seed=3), data(), evaluator)


# Every case on each backend; PyTorch on the CPU is the slower by far: its cases but the plain one are slow.
PAIRS = [
    pytest.param(b.values[0], case, marks=[*b.marks, *([pytest.mark.slow] if b.values[0] == "cuda" and case in
                 ("sliding", "ttt_full", "ttt_lora_phased") else [])], id=f"{b.values[0]}-{case}")
    for b in BACKENDS for case in CASES
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("backend_name", "case"), PAIRS)
def test_pgolfs_evaluations_pass(backend_name, case):
    cfg, evaluator = CASES[case]
    swap, check, _, meter = run(make_backend(backend_name, cfg), cfg, evaluator)
    assert check.leak_position is None and not check.order_changed, check
    assert check.max_change <= 1e-6
    assert check.checked >= 40  # a real share of the 192 targets
    assert meter.tokens == 192 and np.isfinite(meter.val_bpb)
    assert swap.tokens[swap.first] != data().tokens[swap.first]


class LearnsFirst:
    """A backend that trains on what it is asked to score, then scores it (the plain windows, the
    sliding ones, the full mode's), and whose LoRA adapters train on a chunk before it is scored."""

    def __init__(self, backend):
        self.inner = backend
        self.learner = backend.ttt()
        self.learner.sgd_reset(0.0)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def token_losses(self, x, y):
        self.learner.sgd_step(x, y, 0.05, x.size, 0.0)
        return self.inner.token_losses(x, y)

    def ttt(self):
        return AdaptsFirst(self.inner.ttt())


class PeeksAhead:
    """A scorer whose loss at a target depends on the next target (as a window reading past its end)."""

    def __init__(self, backend):
        self.inner = backend

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def token_losses(self, x, y):
        losses = np.asarray(self.inner.token_losses(x, y)).copy()
        losses[:, :-1] += 1e-4 * y[:, 1:]
        return losses


@pytest.mark.slow
@pytest.mark.parametrize(("backend_name", "case"), PAIRS)
def test_an_evaluation_that_learns_before_it_scores_fails(backend_name, case):
    cfg, evaluator = CASES[case]
    swap, check, _, _ = run(LearnsFirst(make_backend(backend_name, cfg)), cfg, evaluator)
    assert check.leak_position is not None and check.max_change > 1e-6, check
    assert check.leak_position not in range(swap.first, swap.end + 1)  # outside what changed


@needs("mlx")
@pytest.mark.parametrize("case", ["plain", "sliding"])
def test_a_scorer_that_reads_past_its_target_fails(case):
    cfg, evaluator = CASES[case]
    swap, check, _, _ = run(PeeksAhead(make_backend("mlx", cfg)), cfg, evaluator)
    assert check.leak_position == swap.first - 1  # the target just before the first changed token
    assert check.leak_document == swap.document


def test_the_check_covers_what_was_scored_before_the_change_and_nothing_after():
    """Writes: 0 scores 1..3, 1 scores 4..7 (the change starts at 6), 2 scores 8..9. Checked: 1..5."""
    tokens = np.array([1, 5, 6, 7, 1, 8, 9, 10, 1, 11])
    swap = Swap(tokens, None, document=1, start=4, end=8, first=6)
    order = np.array([-1, 0, 0, 0, 1, 1, 1, 1, 1, 2])
    loss = np.array([np.nan, 1, 1, 1, 1, 1, 1, 1, 1, 1], np.float32)
    for moved, caught in ((5, True), (3, True), (6, False), (8, False), (9, False)):
        after = loss.copy()
        after[moved] += 0.5
        check = compare(swap, 1, tokens, (loss, order), (after, order))
        assert check.checked == 5
        assert (check.leak_position == moved) is caught and (check.leak_position is None) is not caught
    assert compare(swap, 1, tokens, (loss, order), (loss, order[::-1])).order_changed
    after = loss.copy()
    after[9] += 0.25
    check = compare(swap, 1, tokens, (loss, order), (after, order))
    assert (check.later, check.later_max_change) == (1, 0.25)


def test_the_changed_document_keeps_its_length_tokens_and_bos():
    d = data()
    order = np.arange(len(d.tokens))
    swap = swap_document(d, 1, order, seed=0)
    same = np.ones(len(d.tokens), bool)
    same[swap.first : swap.end] = False
    assert np.array_equal(swap.tokens[same], d.tokens[same])
    assert sorted(swap.tokens[swap.first : swap.end]) == sorted(d.tokens[swap.first : swap.end])
    assert np.array_equal(np.flatnonzero(swap.tokens == 1), np.flatnonzero(d.tokens == 1))
    assert d.tokens[swap.start] == 1 and swap.start < swap.first < swap.end
    assert swap.end == len(d.tokens) or d.tokens[swap.end] == 1
    assert (swap.first - swap.start - 1) % 8 and swap.first % 8  # mid-chunk


def test_calibration_names_training_shards_or_fails(tmp_path):
    from core.train.calibration import write_calibration

    data_path = tmp_path / "data"
    data_path.mkdir()
    for name in ("fineweb_train_000000.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"):
        (data_path / name).write_bytes(name.encode())  # each its own content
    (data_path / "fineweb_train_000002.bin").symlink_to(data_path / "fineweb_val_000000.bin")
    cfg = preset("smoke").replace(data_path=str(data_path), quant_format="mixed", gptq_enabled=True)
    artifact = tmp_path / "final_model.mixed.pgolf"
    assert check_calibration(artifact, cfg).status == "not recorded"
    assert check_calibration(artifact, cfg.replace(gptq_enabled=False)).status == "none"
    record = write_calibration(artifact, cfg, [data_path / "fineweb_train_000001.bin"])
    assert record.name == "final_model.mixed.calibration.json"
    found = check_calibration(artifact, cfg)
    # The symlinked "train" shard is the validation shard's file: refused by what it is, not its name.
    assert found.shards == [f"fineweb_train_00000{i}.bin" for i in range(3)]
    assert found.bad == ["fineweb_train_000002.bin"] and not found.legal
    (data_path / "fineweb_train_000002.bin").unlink()
    stored = json.loads(record.read_text())
    stored["gptq_shards"] = ["fineweb_train_000000.bin"]
    record.write_text(json.dumps(stored))
    assert check_calibration(artifact, cfg).legal
    stored["fit_shards"] = ["fineweb_val_000000.bin"]
    record.write_text(json.dumps(stored))
    assert check_calibration(artifact, cfg).bad == ["fineweb_val_000000.bin"]


# ------------------------------------------------------------------ the command, and package
@pytest.fixture(scope="module")
def ttt_run(sotu_dataset, tmp_path_factory):
    """A smoke run with GPTQ and test-time training (LoRA, one global phase), through the CLI (MLX: the
    faster on a CPU); its 2,048 validation tokens are one document, the first of a speech."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "mlx", "--preset", "smoke", "--out-dir", str(out), "--run-id", "t",
                 "--seed", "3", "--quant-format", "mixed", "--gptq-enabled", "--gptq-calibration-batches", "2",
                 "--ttt-enabled", "--ttt-chunk-size", "32", "--ttt-eval-seq-len", "64", "--ttt-batch-size", "4",
                 "--phased-ttt-num-phases", "1", "--phased-ttt-prefix-docs", "4", "--global-ttt-chunk-tokens", "256",
                 "--global-ttt-batch-seqs", "2", "--val-max-tokens", "2048", *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "t"


@pytest.mark.slow  # ~45 s on two busy cores: three commands
@needs("mlx")
def test_audit_passes_a_ttt_run_and_package_writes_the_compliance_section(ttt_run, tmp_path):
    result = cli("audit", str(ttt_run), "--backend", "mlx", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["legal"] and found["evaluation"] == "ttt" and found["verdict"] == "pass"
    assert found["check"]["checked"] > 100 and found["check"]["max_change"] <= 1e-6
    assert found["calibration"]["status"] == "training shards only" and found["calibration"]["shards"]
    artifact = Path(found["artifact"])
    assert artifact.parent == ttt_run and found["artifact_bytes"] == artifact.stat().st_size
    assert artifact.with_suffix(".calibration.json").is_file()
    code = re.search(r"^Code size: (\d+) bytes$", (ttt_run / "train.log").read_text(), re.M)
    assert found["code_bytes"] == int(code.group(1))  # the run's own figure
    assert found["command"] == f"python cli.py audit {ttt_run} --backend mlx"
    table = cli("audit", str(ttt_run), "--backend", "mlx", "--evaluation", "plain")
    assert table.returncode == 0 and "tokens checked" in table.stdout and "verdict" in table.stdout

    out = tmp_path / "rec"
    packaged = cli("package", str(ttt_run), "--name", "Smoke TTT", "--out", str(out), "--backend", "mlx")
    assert packaged.returncode == 0, packaged.stderr
    readme = (out / "README.md").read_text()
    section = readme[readme.index("## Compliance") :]
    assert f"python cli.py audit {ttt_run} --backend mlx" in section
    assert "| 3 | pass |" in section and "training shards only" in section


@pytest.mark.slow
@needs("mlx")
def test_audit_refuses_a_checkpoint_and_an_unknown_evaluation(ttt_run):
    checkpoints = sorted((ttt_run / "checkpoints").glob("*.safetensors"))
    if checkpoints:
        assert_one_line_error(cli("audit", str(checkpoints[-1]), "--backend", "mlx"), "no artifact")
    assert_one_line_error(
        cli("audit", str(ttt_run), "--backend", "mlx", "--evaluation", "sliding_window"), "evaluations are"
    )


@pytest.mark.slow
def test_package_writes_the_audits_and_refuses_a_run_that_fails_one(tmp_path):
    from core.common.errors import PgolfError
    from core.runs.package import write_record

    runs = [
        fake_run(tmp_path / name, Config(seed=seed), artifact=10, log="log")
        for name, seed in (("a", 1), ("b", 2))
    ]
    with pytest.raises(PgolfError, match=r"b fails the audit: LEAK: the loss of token 77 \(document 4\)"):
        write_record(
            runs, tmp_path / "bad", "x", audit=lambda p: made_audit(p, 77 if p.name == "b" else None)
        )
    assert not (tmp_path / "bad").exists()
    folder, _ = write_record(runs, tmp_path / "good", "x", audit=lambda p: made_audit(p, None))
    section = (folder / "README.md").read_text().split("## Compliance", 1)[1]
    assert "| 1 | pass | ttt | 900 | 0 | training shards only (1 file) | 1,000 | 500 | 1.5 s |" in section
    assert f"python cli.py audit {runs[0]}\npython cli.py audit {runs[1]}" in section
