"""Test-time training (core/eval/ttt.py): the record's numbers, legality by construction, both backends alike."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.config.presets import preset
from core.data.tables import ByteTables
from core.eval.bpb import EvalData
from core.eval.score import evaluators
from core.eval.ttt import chunk_window, evaluate_ttt, find_documents, global_lr, plan_batches
from tests.golden_data import GOLDEN, read_golden, record_config
from tests.support import ROOT
from tests.support.backends import BACKENDS, busy_params, make_backend, needs, run_ranks
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.ttt import LEGAL_CFG, AdaptsFirst, stream, unit_tables

# ----------------------------------------------------------- the record's own TTT (make_record_ttt.py)
RECORD_TTT = GOLDEN / "record_ttt.safetensors"


@pytest.fixture(scope="module")
def record_ttt():
    meta, tensors = read_golden(RECORD_TTT, "")
    meta = json.loads(meta["ttt"])
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    tables = ByteTables(tensors["base_bytes"], tensors["has_leading_space"], tensors["is_boundary"])
    return meta, params, EvalData(tensors["tokens"], tables), tensors


@pytest.mark.slow
@pytest.mark.parametrize("case", ["lora", "sgd_cold", "phased"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_ttt_scores_what_the_record_scores(record_ttt, backend_name, case):
    """Record 2026-04-27's eval_val_ttt_phased on a SmearGate model with loops and lanes: LoRA on every
    target (AdamW, two steps a chunk, A kept warm), SGD with A drawn afresh, and two global phases."""
    meta, params, data, tensors = record_ttt
    cfg = record_config(meta["cases"][case]).replace(bos_id=1, seed=meta["case_seed"])
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    meter = evaluate_ttt(backend, data)
    assert meter.tokens == len(data.tokens) - 1
    assert meter.val_loss == pytest.approx(float(tensors[f"{case}/val_loss"]), rel=2e-6)
    assert meter.val_bpb == pytest.approx(float(tensors[f"{case}/val_bpb"]), rel=2e-6)


@pytest.mark.parametrize("case", ["full", "frozen"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_full_mode_scores_what_the_record_scores(record_ttt, backend_name, case):
    """Record 2026-04-06's eval_val_sliding_ttt on its own model (loops, skip gates): chunks of 96 tokens
    scored with sliding windows (stride 8), then two epochs of SGD on each; the first two blocks frozen."""
    meta, _, data, tensors = record_ttt
    params = {k.removeprefix("full/param/"): v for k, v in tensors.items() if k.startswith("full/param/")}
    cfg = record_config(meta["full_cases"][case]).replace(ttt_mode="full")
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    meter = evaluate_ttt(backend, data)
    assert meter.tokens == len(data.tokens) - 1
    assert meter.val_loss == pytest.approx(float(tensors[f"full/{case}/val_loss"]), rel=2e-6)
    assert meter.val_bpb == pytest.approx(float(tensors[f"full/{case}/val_bpb"]), rel=2e-6)


def test_ttt_moves_the_score(record_ttt):
    """The cases differ from each other and from the plain score by far more than the tolerance above."""
    _, _, _, tensors = record_ttt
    losses = [float(tensors[f"{case}/val_loss"]) for case in ("lora", "sgd_cold", "phased")]
    assert min(abs(a - b) for i, a in enumerate(losses) for b in losses[i + 1 :]) > 1e-4


# ------------------------------------------------------------------------------- the plan
def test_documents_run_from_bos_to_the_next_bos_included():
    tokens = np.array([1, 5, 6, 1, 7, 1, 1, 8, 9])
    docs = find_documents(tokens, 1)
    assert [(d.start, d.length) for d in docs] == [(0, 4), (3, 3), (5, 2), (6, 3)]
    with pytest.raises(PgolfError, match="start with a document's BOS"):
        find_documents(np.array([5, 1, 6]), 1)


def test_batches_group_similar_lengths_longest_first():
    docs = find_documents(np.array([1, *[5] * 9, 1, 5, 1, *[5] * 4, 1, *[5] * 6]), 1)
    queue = plan_batches(docs, 2)
    assert [[d.index for d in batch] for batch in queue] == [[3, 0], [1, 2]]
    lengths = [[d.length for d in batch] for batch in queue]
    assert lengths == [[7, 11], [3, 6]]  # sorted by length into batches, the longest batch first


def test_chunk_windows_end_with_their_chunk():
    # 20 targets, chunks of 8, forwards of at most 12 tokens
    windows = [chunk_window(c, 20, 8, 12) for c in range(3)]
    assert [(w.start, w.length, w.offset, w.scored) for w in windows] == [
        (0, 8, 0, 8),
        (4, 12, 4, 8),
        (8, 12, 8, 4),
    ]


def test_the_global_lr_warms_up_then_decays_to_zero():
    cfg = preset("smoke").replace(
        global_ttt_lr=0.1, global_ttt_warmup_chunks=2, global_ttt_warmup_start_lr=0.02
    )
    lrs = [global_lr(cfg, c, 6) for c in range(6)]
    assert lrs[:2] == pytest.approx([0.02, 0.1])
    assert lrs[2] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:]))


# ------------------------------------------------------------------------------ legality


def per_token(backend, tokens: np.ndarray, params) -> tuple[np.ndarray, float]:
    backend.load_params(params)
    losses = np.full(len(tokens), np.nan, np.float32)
    meter = evaluate_ttt(backend, EvalData(tokens, unit_tables(backend.cfg.vocab_size)), token_losses=losses)
    return losses, meter.nats


def moved_before(backend, params, tokens: np.ndarray, position: int) -> np.ndarray:
    """Stream positions whose loss moves when the token at `position` changes, though scored before it
    was seen: the rule's breaches. A target is scored before a token is seen unless it is in the
    token's own document at or after it, or in a batch that comes later."""
    before, _ = per_token(backend, tokens, params)
    changed = tokens.copy()
    changed[position] = 2 + (changed[position] + 1) % 1000
    after, _ = per_token(backend, changed, params)
    docs = find_documents(tokens, 1)
    queue = plan_batches(docs, backend.cfg.ttt_batch_size)
    turn = {doc.index: q for q, batch in enumerate(queue) for doc in batch}
    doc_of = np.zeros(len(tokens), dtype=int)
    for doc in docs:
        doc_of[doc.start + 1 : doc.start + doc.length] = doc.index
    home = doc_of[position]
    later = np.array([turn[d] > turn[home] for d in doc_of])
    allowed = later | ((doc_of == home) & (np.arange(len(tokens)) >= position))
    moved = np.flatnonzero(before[1:] != after[1:]) + 1
    return moved[~allowed[moved]]


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_no_loss_scored_before_a_token_depends_on_it(backend_name):
    backend = make_backend(backend_name, LEGAL_CFG)
    params = busy_params(LEGAL_CFG, seed=3)
    tokens = stream()
    docs = find_documents(tokens, 1)
    long_doc = max(docs, key=lambda d: d.length)
    for position in (long_doc.start + 13, long_doc.start + long_doc.length - 2, docs[2].start + 4):
        assert moved_before(backend, params, tokens, position).size == 0


@pytest.mark.slow
@needs("mlx")
def test_training_before_scoring_is_caught():
    """The check above has teeth: a backend that learns from a chunk before scoring it breaks it."""

    class Cheat:
        def __init__(self, backend):
            self.inner = backend

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def ttt(self):
            return AdaptsFirst(self.inner.ttt())

    backend = Cheat(make_backend("mlx", LEGAL_CFG))
    tokens = stream()
    long_doc = max(find_documents(tokens, 1), key=lambda d: d.length)
    assert moved_before(backend, busy_params(LEGAL_CFG, seed=3), tokens, long_doc.start + 13).size > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_every_target_is_scored_once_and_the_weights_come_back(backend_name):
    backend = make_backend(backend_name, LEGAL_CFG)
    params = busy_params(LEGAL_CFG, seed=3)
    tokens = stream(1)
    losses, nats = per_token(backend, tokens, params)
    assert np.isfinite(losses[1:]).all() and np.isnan(losses[0])
    assert losses[1:].astype(np.float64).sum() == pytest.approx(nats, rel=1e-6)
    backend.load_params(params)
    evaluate_ttt(backend, EvalData(tokens, unit_tables(LEGAL_CFG.vocab_size)))
    after = backend.params()
    assert all(np.array_equal(after[k], params[k]) for k in params)  # the phases trained a copy
    assert "ttt" in evaluators(LEGAL_CFG) and "ttt" not in evaluators(preset("smoke"))


@pytest.mark.slow
@needs("cuda")
@needs("mlx")
def test_both_backends_give_the_same_ttt_losses():
    """Every token's TTT loss, global phase included, within 2e-5 nats across the backends (fp32)."""
    params = busy_params(LEGAL_CFG, seed=4)
    tokens = stream(2)
    got = [per_token(make_backend(name, LEGAL_CFG), tokens, params)[0] for name in ("cuda", "mlx")]
    np.testing.assert_allclose(got[0][1:], got[1][1:], rtol=0, atol=2e-5)


@needs("cuda")
@pytest.mark.cuda
@pytest.mark.slow
def test_the_compiled_ttt_forward_scores_what_eager_does():
    """torch.compile of the LoRA forward (dynamic shapes: each batch has its own window length), on a CPU:
    every token's TTT loss within 1e-5 nats of the eager forward's. The graphs dynamo and AOT autograd
    make of it with symbolic shapes are what is tested (`compile_backend="aot_eager"`: no inductor code
    generation), and one layer: the depth is not what is tested, and both make a cold compile cheaper.
    Two batches of two documents (a batch of another size makes its shapes' symbols more general and the
    trace slower: test_a_batch_of_another_size_compiles_nothing_new): one graph scores and one learns
    (grad mode on), each window length going through them."""
    cfg = LEGAL_CFG.replace(num_layers=1, compile_backend="aot_eager", ttt_batch_size=2)
    params = busy_params(cfg, seed=5)
    tokens = stream(3)[:69]  # four documents, forwards of 8 to 24 tokens
    eager, compiled = (make_backend("cuda", cfg.replace(compile=mode)) for mode in ("off", "on"))
    assert compiled.ttt()._losses is not compiled.model.token_losses
    np.testing.assert_allclose(
        per_token(compiled, tokens, params)[0][1:], per_token(eager, tokens, params)[0][1:], rtol=0, atol=1e-5
    )


@needs("cuda")
@pytest.mark.cuda
@pytest.mark.slow
def test_a_batch_of_another_size_compiles_nothing_new():
    """Batches of three documents, then a last one of two: the compiled LoRA forward (dynamo's graphs and
    guards alone, `compile_backend="eager"`) keeps one graph that scores and one that learns. Adapters
    held as nn.Parameter had their batch size guarded: on a GPU, the last batch compiled both again."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = LEGAL_CFG.replace(num_layers=1, compile="on", compile_backend="eager", ttt_batch_size=3)
    torch._dynamo.reset()
    counters.clear()
    per_token(make_backend("cuda", cfg), stream(3)[:90], busy_params(cfg, seed=5))  # five documents
    assert counters["stats"]["unique_graphs"] == 2


# ------------------------------------------------------------------------------ the CLI
TTT_FLAGS = [
    "--ttt-enabled", "--ttt-lora-rank", "8", "--ttt-batch-size", "8", "--ttt-chunk-size", "32",
    "--ttt-eval-seq-len", "128", "--phased-ttt-prefix-docs", "4", "--global-ttt-chunk-tokens", "1024",
    "--global-ttt-batch-seqs", "4",
]  # fmt: skip


@pytest.mark.slow
@needs("mlx")
def test_a_run_ends_with_its_ttt_score_and_eval_saves_every_token_loss(sotu_dataset, tmp_path):
    result = cli("train", "--backend", "mlx", "--preset", "smoke", "--iterations", "20", "--val-max-tokens", "2048",
                 "--out-dir", str(tmp_path), "--run-id", "r", *data_flags(sotu_dataset), *TTT_FLAGS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("final_int8_zlib_ttt_exact "))
    trained_bpb = float(line.split("val_bpb:")[1].split()[0])
    assert "total_eval_time:" in result.stdout and "with test-time training" in result.stdout
    artifact = str(tmp_path / "r" / "final_model.int8.pgolf")
    out = tmp_path / "losses.npz"
    result = cli(
        "eval", artifact, "--backend", "mlx", "--save-token-losses", str(out), *data_flags(sotu_dataset)
    )
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "eval:ttt" in x)
    assert float(line.split("val_bpb:")[1].split()[0]) == pytest.approx(
        trained_bpb, abs=1e-8
    )  # the run's settings were kept
    saved = np.load(out)
    losses, nbytes = saved["losses"].astype(np.float64), saved["bytes"]
    assert np.isnan(losses[0]) and np.isfinite(losses[1:]).all()
    assert losses[1:].sum() / np.log(2) / nbytes.sum() == pytest.approx(trained_bpb, rel=1e-6)
    bad = cli(
        "eval", artifact, "--save-token-losses", str(tmp_path / "no" / "x.npz"), *data_flags(sotu_dataset)
    )
    assert_one_line_error(bad, "--save-token-losses", "does not exist")


@pytest.fixture(scope="module")
def mlx_artifact(sotu_dataset, tmp_path_factory):
    """A 10-step smoke run's artifact, trained once for both backends' test below."""
    out = tmp_path_factory.mktemp("runs")
    trained = cli("train", "--backend", "mlx", "--preset", "smoke", "--iterations", "10", "--out-dir",
                  str(out), "--run-id", "r", *data_flags(sotu_dataset))  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    return out / "r" / "final_model.int8.pgolf"


def phased_ttt_args(artifact: Path, dataset, backend_name: str) -> list[str]:
    """Three documents one at a time, longest first; the phase trains on the first two before the third."""
    return ["eval", str(artifact), "--backend", backend_name, *TTT_FLAGS,
            "--val-max-tokens", "10000", "--ttt-batch-size", "1", "--phased-ttt-prefix-docs", "2",
            "--ttt-chunk-size", "128", "--ttt-eval-seq-len", "256",
            "--ttt-lora-lr", "0", "--global-ttt-lr", "0.01", *data_flags(dataset)]  # fmt: skip


def ttt_bpb(result: subprocess.CompletedProcess) -> float:
    assert result.returncode == 0, result.stderr[-3000:]
    return float(
        next(x for x in result.stdout.splitlines() if "eval:ttt" in x).split("val_bpb:")[1].split()[0]
    )


@pytest.fixture(scope="module")
def one_process_ttt(mlx_artifact, sotu_dataset) -> float:
    """The phased TTT score of one MLX process, which both backends' two ranks must give (the backends
    agree to about 1e-7 here: test_both_backends_give_the_same_ttt_losses)."""
    args = phased_ttt_args(mlx_artifact, sotu_dataset, "mlx")
    one, no_phase = ttt_bpb(cli(*args)), ttt_bpb(cli(*args, "--phased-ttt-num-phases", "0"))
    assert abs(one - no_phase) > 1e-4  # the global phase moved the score
    return one


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
@needs("mlx")  # the run is trained with MLX
def test_two_ranks_score_what_one_does(backend_name, sotu_dataset, mlx_artifact, one_process_ttt):
    """Two processes share the documents out (PyTorch: a counter in torch.distributed's store; MLX: turns)
    and train the global phase together: the same TTT score as one process. The adapters' learning
    rate is 0 here: with it, which A a batch starts from depends on the batches its rank took before."""
    args = phased_ttt_args(mlx_artifact, sotu_dataset, backend_name)
    two = run_ranks(backend_name, str(ROOT / "cli.py"), *args)
    assert ttt_bpb(two) == pytest.approx(one_process_ttt, abs=1e-6)
