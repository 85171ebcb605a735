"""Scoring weights on the validation tokens: over non-overlapping sequences, or sliding windows.

Each backend scores a span (`eval_nll`) or gives per-token losses (`token_losses`); this module
cuts the validation tokens, counts their bytes and sums over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.common.errors import PgolfError, hint, memory_hint, setting
from core.config.fields import Config
from core.data.shards import find_shards, load_val_bytes, load_val_tokens, val_spans
from core.data.tokenizer import ByteTables, byte_tables, check_vocab, load_tokenizer
from core.eval.bpb import BPBMeter, stream_bytes

if TYPE_CHECKING:  # only annotations name the backend's interface
    from core.eval.sliding import SlidingEval
    from core.model.backend import Backend

Progress = Callable[[int, int], None]  # (done, total) of something long


@dataclass
class EvalData:
    """What scoring needs: the validation tokens, the tokenizer's byte tables, and for CaseOps data
    the byte sidecar (each token's original UTF-8 bytes, core/datasets/caseops.py)."""

    tokens: np.ndarray
    tables: ByteTables
    sidecar: np.ndarray | None = None  # exactly one entry per token, or None: the tables count the bytes

    @cached_property
    def target_bytes(self) -> np.ndarray:
        """int64 bytes of text each token stands for as a target, by stream position: index i counts
        tokens[i] after tokens[i - 1]; index 0 (never a target) counts 0. From the sidecar when the
        data has one, else from the tables. Every evaluation adds these up for the tokens it scores,
        in whatever order it scores them."""
        if self.sidecar is None:
            return stream_bytes(self.tokens, self.tables)
        out = np.asarray(self.sidecar, dtype=np.int64).copy()
        out[:1] = 0
        return out


def load_eval_data(cfg: Config) -> EvalData:
    """The validation tokens of `cfg.data_path`, with the byte sidecar beside them when
    `caseops_enabled`; a sidecar there without it, or none with it, is refused (either way the
    bytes would not be the text's)."""
    sp = load_tokenizer(cfg.tokenizer_path)
    check_vocab(sp, cfg.vocab_size, cfg.tokenizer_path)
    if (cfg.smear_gate_enabled or cfg.varlen_attn_enabled) and sp.bos_id() != cfg.bos_id:
        what = "SmearGate would smear" if cfg.smear_gate_enabled else "attention would reach"
        raise PgolfError(
            f"bos_id={cfg.bos_id}, but the tokenizer {cfg.tokenizer_path} starts documents with {sp.bos_id()}: "
            f"{what} across document starts (set {setting('bos_id')})"
        )
    files = find_shards(cfg.data_path, "val")
    tokens = load_val_tokens(files, cfg.eval_window, cfg.val_max_tokens, cfg.vocab_size)
    has = any(Path(cfg.data_path).glob("fineweb_val_bytes_*.bin"))
    if has != cfg.caseops_enabled:
        raise PgolfError(
            f"caseops_enabled is {'off' if has else 'on'}, but {cfg.data_path} has {'a' if has else 'no'} "
            "validation byte sidecar (fineweb_val_bytes_*.bin, CaseOps data): "
            + (
                f"set {setting('caseops_enabled', True)}"
                if has
                else hint("data prepare --caseops makes one", "set DATA_PATH to CaseOps data")
            )
        )
    sidecar = load_val_bytes(files, len(tokens)) if has else None
    return EvalData(tokens=tokens, tables=byte_tables(sp, cfg.vocab_size), sidecar=sidecar)


def evaluate(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb over non-overlapping sequences of `eval_window` tokens, split over ranks.
    `sink` (one float per token) receives each target's loss at its stream position, which costs a
    copy of every loss to the host."""
    with memory_hint("validation", "--val-batch-size"):
        return _evaluate(backend, data, progress, sink)


def _evaluate(
    backend: Backend, data: EvalData, progress: Progress | None, sink: np.ndarray | None
) -> BPBMeter:
    cfg = backend.cfg
    if sink is not None:  # the same windows, scored token by token
        from core.eval.sliding import SlidingEval

        ev = SlidingEval(cfg.eval_window, cfg.eval_window, max(cfg.val_batch_size // cfg.eval_window, 1))
        return _score_windows(backend, data, ev, progress, sink)
    seq = cfg.eval_window
    batch_seqs = max(cfg.val_batch_size // cfg.grad_accum_steps // seq, 1)
    spans = val_spans(len(data.tokens), seq, batch_seqs, backend.rank, backend.world_size)
    meter = BPBMeter()
    nll = 0.0  # then the framework's 0-d array: the sum stays on the device
    for i, (start, end) in enumerate(spans):
        chunk = data.tokens[start:end].astype(np.int32)
        x, y = chunk[:-1].reshape(-1, seq), chunk[1:].reshape(-1, seq)
        nll = nll + backend.eval_nll(x, y)  # queued, not waited for
        meter.count_bytes(data.target_bytes[start + 1 : end])  # the targets' bytes, while the device works
        if progress is not None:
            progress(i + 1, len(spans))  # batches queued: the device may be a little behind
    meter.nats = float(nll)  # the one wait for the device
    return BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))


def evaluate_flat(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb as record 2026-04-27's `eval_val` computes them (`eval_protocol` flat): each
    rank takes its share of the sequences of `eval_window` tokens, as `evaluate` does, keeps only whole
    batches of val_batch_size / grad_accum_steps tokens (the record's VAL_BATCH_TOKENS / (WORLD_SIZE x
    GRAD_ACCUM_STEPS): pgolf's grad_accum_steps counts the micro-batches of all ranks), and scores each
    batch as ONE sequence: RoPE positions run over the whole batch, and attention is cut at each BOS and
    every `eval_window` tokens from a document's start (or the batch's). Losses are summed in float64."""
    cfg = backend.cfg
    seq = cfg.eval_window
    batch_seqs = cfg.val_batch_size // cfg.grad_accum_steps // seq  # Config.validate: at least one
    spans = val_spans(len(data.tokens), seq, batch_seqs, backend.rank, backend.world_size, whole=True)
    meter = BPBMeter()
    with backend.segments_every(seq):
        for i, (start, end) in enumerate(spans):
            chunk = data.tokens[start:end].astype(np.int32)
            losses = backend.token_losses(chunk[None, :-1], chunk[None, 1:])[0]
            meter.nats += float(np.sum(losses, dtype=np.float64))
            meter.count_bytes(data.target_bytes[start + 1 : end])
            if sink is not None:
                sink[start + 1 : end] = losses
            if progress is not None:
                progress(i + 1, len(spans))
    total = BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))
    if total.tokens == 0:
        raise PgolfError(
            f"eval_protocol=flat: {len(data.tokens):,} validation tokens hold no whole batch of "
            f"{batch_seqs * seq:,} tokens (val_batch_size / grad_accum_steps) on any of {backend.world_size} "
            "rank(s): lower val_batch_size (VAL_BATCH_TOKENS)"
        )
    return total


def evaluate_sliding(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb with sliding windows (`eval_stride`, see core/eval/sliding.py), split over ranks."""
    from core.eval.sliding import SlidingEval

    cfg = backend.cfg
    ev = SlidingEval(cfg.eval_window, cfg.eval_stride, cfg.eval_batch_seqs)
    with memory_hint("the sliding-window score", "--eval-batch-seqs"):
        return _score_windows(backend, data, ev, progress, sink)


def _score_windows(
    backend: Backend, data: EvalData, ev: SlidingEval, progress: Progress | None, sink: np.ndarray | None
) -> BPBMeter:
    """The windows of `ev` over the validation tokens, this rank's share, summed over the ranks."""
    from core.eval.sliding import score_sliding

    meter = score_sliding(
        data.tokens,
        backend.token_losses,
        data.target_bytes,
        ev,
        backend.rank,
        backend.world_size,
        progress,
        sink,
    )
    return BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))


def evaluate_with_ttt(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb with test-time training (core/eval/ttt.py); the backend's weights are
    the same afterwards."""
    from core.eval.ttt import evaluate_ttt

    cfg = backend.cfg
    trains_weights = cfg.ttt_mode == "full" or (
        cfg.phased_ttt_num_phases > 0 and cfg.phased_ttt_prefix_docs > 0
    )
    before = backend.params() if trains_weights else None
    with memory_hint("test-time training", ttt_memory_settings(cfg)):
        meter = evaluate_ttt(backend, data, progress, token_losses=sink)
    if before is not None:
        backend.load_params(before)
    return meter


def ttt_memory_settings(cfg: Config) -> str:
    """The settings that size test-time training's memory, in `cfg`'s mode."""
    if cfg.ttt_mode == "full":
        return "--ttt-batch-seqs"
    phases = cfg.phased_ttt_num_phases > 0 and cfg.phased_ttt_prefix_docs > 0
    return "--ttt-batch-size, --ttt-lora-rank or --ttt-eval-seq-len" + (
        " (global phases: --global-ttt-batch-seqs)" if phases else ""
    )


Evaluator = Callable[..., BPBMeter]  # (backend, data, progress=None, sink=None)


def figure_protocol(name: str, cfg: Config) -> str:
    """How figure `name` of `evaluators` was computed, for the logs: rows:<len>, flat:<batch>/<len>
    (record 2026-04-27's batches of <batch> tokens cut every <len>), sliding:<len>/<stride>, ttt."""
    if name == "plain" and cfg.eval_protocol == "flat":
        return f"flat:{cfg.val_batch_size // cfg.grad_accum_steps}/{cfg.eval_window}"
    if name == "plain":
        return f"rows:{cfg.eval_window}"
    if name == "sliding_window":
        return f"sliding:{cfg.eval_window}/{cfg.eval_stride}"
    return name


def evaluators(cfg: Config) -> dict[str, Evaluator]:
    """The figures a final score reports: "plain" (non-overlapping sequences: pgolf's rows, or with
    `eval_protocol` flat record 2026-04-27's flat batches), "sliding_window" when `eval_stride` makes the
    windows overlap, and "ttt" with `ttt_enabled`."""
    out: dict[str, Evaluator] = {"plain": evaluate_flat if cfg.eval_protocol == "flat" else evaluate}
    if cfg.sliding_eval:
        out["sliding_window"] = evaluate_sliding
    if cfg.ttt_enabled:
        out["ttt"] = evaluate_with_ttt
    return out
