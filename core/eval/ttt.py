"""Test-time training that scores first: the validation tokens scored chunk by chunk, each chunk
learnt from only after it is scored (the challenge's rule for adapting at evaluation).

Two modes (`ttt_mode`), framework-neutral (the backend runs the forward passes and optimizer steps):
`full` (records 2026-04-06 to 04-09, `score_full` at the end: every weight trained by SGD on each
chunk of the stream once scored, scored in sliding windows), and `lora` (2026-04-13 on):

- documents run from a BOS to the next BOS, which each one also predicts (the last one runs to
  the end of the tokens); they are sorted by length and cut into batches of `ttt_batch_size`,
  the batches taken longest first;
- each batch gets LoRA adapters (core/model/lora.py), one row per document: B restarts at zero
  for every batch, A too unless `ttt_warm_start_a` keeps the last batch's;
- a document's targets are cut into chunks of `ttt_chunk_size`; chunk c is scored by a forward
  over at most `ttt_eval_seq_len` tokens ending with it, and then, unless it is the document's
  last, `ttt_grad_steps` optimizer steps train the adapters on that chunk's mean loss;
- phases (`phased_ttt_num_phases` > 0): when the first `phased_ttt_prefix_docs` documents in
  the batches' order are scored (in even steps, one per phase), every weight of the model trains
  by SGD on the documents scored so far (`global_ttt_*`), and the adapters start afresh.

Legal by construction: the backend's `TTT` (core/model/backend.py, made once per evaluation) returns a
chunk's losses from the forward before any step that sees it, and every later step only reads tokens
already scored; tests/test_ttt.py changes a token and checks that no loss scored before it moves.
Several ranks take batches from a counter that all share (`Backend.counter_add`); a phase waits until
every batch before it is scored.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.common.errors import PgolfError, memory_hint, setting
from core.config.features import uses_full_ttt
from core.eval.bpb import BPBMeter
from core.eval.sliding import SlidingEval, plan_windows, rank_windows, score_windows
from core.model.lora import initial_a

if TYPE_CHECKING:  # only annotations name these
    from typing import Any

    from core.eval.bpb import EvalData, Progress
    from core.model.backend import TTT, Backend

_evaluations = itertools.count()  # every rank runs the same evaluations: a counter key of its own for each


@dataclass(frozen=True)
class Document:
    index: int  # in stream order
    start: int  # position of its BOS
    length: int  # tokens from its BOS to the next BOS included (the last one: to the end)

    @property
    def targets(self) -> int:
        return self.length - 1


def find_documents(tokens: np.ndarray, bos_id: int) -> list[Document]:
    """The documents of a token stream that starts with BOS; each predicts the next one's BOS too."""
    starts = np.flatnonzero(np.asarray(tokens) == bos_id)
    if starts.size == 0 or starts[0] != 0:
        raise PgolfError(
            f"test-time training: the validation tokens should start with a document's BOS ({bos_id}), "
            f"but start with {int(tokens[0]) if len(tokens) else 'nothing'} (set {setting('bos_id')})"
        )
    ends = np.append(starts[1:] + 1, len(tokens))
    return [
        Document(i, int(s), int(e - s))
        for i, (s, e) in enumerate(zip(starts, ends, strict=True))
        if e - s >= 2
    ]


def plan_batches(docs: list[Document], batch_size: int) -> list[list[Document]]:
    """Batches of documents of similar length, the longest batch first."""
    by_length = sorted(docs, key=lambda d: d.length)  # stable: equal lengths stay in stream order
    batches = [by_length[i : i + batch_size] for i in range(0, len(by_length), batch_size)]
    return sorted(batches, key=lambda batch: -batch[-1].length)


@dataclass(frozen=True)
class ChunkWindow:
    start: int  # first input position of the forward, from the document's start
    length: int  # tokens in the forward
    offset: int  # where the scored chunk starts in the forward
    scored: int  # targets the chunk scores


def chunk_window(c: int, targets: int, chunk_size: int, seq_len: int) -> ChunkWindow:
    """Chunk c of a document with `targets` targets: the forward that ends with it."""
    end = min((c + 1) * chunk_size, targets)  # the last chunk may be short
    start = max(0, end - seq_len)
    return ChunkWindow(start, end - start, c * chunk_size - start, end - c * chunk_size)


def cosine(peak: float, step: int, steps: int) -> float:
    """A learning rate decaying from `peak` at step 0 to 0 at step `steps` along a half cosine."""
    return peak * 0.5 * (1.0 + math.cos(math.pi * step / max(steps, 1)))


def global_lr(cfg, chunk: int, chunks: int) -> float:
    """The global phase's learning rate for chunk `chunk` of `chunks`: linear warm-up, then cosine to 0."""
    warmup = max(0, min(cfg.global_ttt_warmup_chunks, chunks - 1))
    if chunk < warmup:
        t = chunk / max(warmup - 1, 1)
        return cfg.global_ttt_warmup_start_lr + (cfg.global_ttt_lr - cfg.global_ttt_warmup_start_lr) * t
    return cosine(cfg.global_ttt_lr, chunk - warmup, chunks - 1 - warmup)


def sgd_over(
    backend: Backend,
    ttt: TTT,
    tokens: np.ndarray,
    lr: float,
    epochs: int,
    batch_seqs: int,
    clip: float,
    doc_mask: bool,
) -> None:
    """SGD steps at `lr` over the whole sequences of the evaluation length in `tokens` (a span and the
    token after it, their last target), `epochs` times, `batch_seqs` sequences a step shared out over
    the ranks; `doc_mask` off: attention ignores document boundaries even with varlen_attn_enabled."""
    seq = backend.cfg.eval_window
    seqs = (len(tokens) - 1) // seq
    tokens = tokens.astype(np.int32)
    x, y = tokens[: seqs * seq].reshape(-1, seq), tokens[1 : seqs * seq + 1].reshape(-1, seq)
    rank, world = backend.rank, backend.world_size
    for _ in range(epochs):
        for first in range(0, seqs, batch_seqs):
            count = min(batch_seqs, seqs - first)
            mine = slice(first + count * rank // world, first + count * (rank + 1) // world)
            ttt.sgd_step(x[mine], y[mine], lr, count * seq, clip, doc_mask)


def train_global(backend: Backend, ttt: TTT, tokens: np.ndarray, docs: list[Document]) -> None:
    """A global phase: SGD with momentum on every weight over the tokens of `docs` (scored documents,
    joined), chunk by chunk under `global_lr`; the last chunk is not trained on."""
    cfg = backend.cfg
    joined = np.concatenate([tokens[d.start : d.start + d.length] for d in docs])
    size = cfg.global_ttt_chunk_tokens
    chunks = -(-(len(joined) - 1) // size)
    ttt.sgd_reset(cfg.global_ttt_momentum)
    for c in range(chunks - 1):
        sgd_over(
            backend,
            ttt,
            joined[c * size : (c + 1) * size + 1],
            global_lr(cfg, c, chunks),
            cfg.global_ttt_epochs,
            cfg.global_ttt_batch_seqs,
            cfg.global_ttt_grad_clip,
            cfg.global_ttt_respect_doc_boundaries,
        )


def evaluate_ttt(
    backend: Backend, data: EvalData, progress: Progress | None = None, token_losses: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb with test-time training (`ttt_mode`), summed over the ranks; the backend's
    weights are the same afterwards. Out of memory names the settings that size it in the run's mode.
    `token_losses` (float32, one per token, NaN at first) receives each scored target's loss at its
    stream position."""
    cfg = backend.cfg
    phases = cfg.phased_ttt_num_phases > 0 and cfg.phased_ttt_prefix_docs > 0
    full = uses_full_ttt(cfg)
    if full:
        score = score_full
        lower = "--ttt-batch-seqs"
    else:
        score = _score_lora
        lower = "--ttt-batch-size, --ttt-lora-rank or --ttt-eval-seq-len"
        lower += " (global phases: --global-ttt-batch-seqs)" if phases else ""
    before = backend.params() if full or phases else None  # the modes that train weights
    with memory_hint("test-time training", lower):
        meter = score(backend, data, progress, token_losses)
        total = BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))
    if before is not None:
        backend.load_params(before)
    return total


def _score_lora(
    backend: Backend, data: EvalData, progress: Progress | None, token_losses: np.ndarray | None
) -> BPBMeter:
    """The LoRA mode (the module's docstring); this rank's sums."""
    cfg = backend.cfg
    tokens = np.asarray(data.tokens)
    docs = find_documents(tokens, cfg.bos_id)
    queue = plan_batches(docs, cfg.ttt_batch_size)
    # Global phase p trains on the first boundaries[p] documents scored (in queue order) once the batches
    # up to ends[p] are scored; a phase after the last batch would change no score.
    prefix = min(len(docs), cfg.phased_ttt_prefix_docs)
    phases = cfg.phased_ttt_num_phases if prefix else 0
    boundaries = [prefix * (p + 1) // phases for p in range(phases)]
    cumulative = np.cumsum([len(batch) for batch in queue])
    ends = [int(e) for e in np.searchsorted(cumulative, boundaries) if e < len(queue) - 1]
    rng = np.random.default_rng(
        cfg.seed + 7919 * backend.rank
    )  # fresh A matrices: initial_a (B starts at zero)
    # The adapters of full batches are made once (and after each phase), restarted for each batch, A
    # kept warm if ttt_warm_start_a; a shorter batch gets its own.
    ttt = backend.ttt()
    main = ttt.new_adapters(initial_a(cfg, cfg.ttt_batch_size, rng))
    meter = BPBMeter()
    phase = 0
    key = f"pgolf/ttt/{next(_evaluations)}/next_batch"
    while True:
        q = backend.counter_add(key, 1) - 1
        while phase < len(ends) and q > ends[phase]:
            # A barrier (every rank has scored what it took up to ends[phase]), then the documents of
            # those batches by length, as the batches were cut.
            backend.all_reduce_sum(np.zeros(1))
            scored = sorted(
                (d for batch in queue[: ends[phase] + 1] for d in batch), key=lambda d: (d.length, d.index)
            )
            if boundaries[phase]:
                train_global(backend, ttt, tokens, scored[: boundaries[phase]])
            main = ttt.new_adapters(initial_a(cfg, cfg.ttt_batch_size, rng))
            phase += 1
        if q >= len(queue):
            break
        batch = queue[q]
        if len(batch) == cfg.ttt_batch_size:
            ttt.restart_adapters(main, None if cfg.ttt_warm_start_a else initial_a(cfg, len(batch), rng))
            adapters = main
        else:
            adapters = ttt.new_adapters(initial_a(cfg, len(batch), rng))
        for nll, positions in _score_batch(backend, ttt, tokens, batch, adapters):
            meter.add(nll, positions, data.target_bytes, token_losses)
        if progress is not None:
            progress(q + 1, len(queue))
    return meter


def _score_batch(backend: Backend, ttt: TTT, tokens: np.ndarray, batch: list[Document], adapters: Any):
    """Score a batch chunk by chunk, training after each chunk; yields (losses, stream positions)."""
    cfg = backend.cfg
    size, seq = cfg.ttt_chunk_size, cfg.ttt_eval_seq_len
    for c in range(-(-max(doc.targets for doc in batch) // size)):
        full = chunk_window(c, (c + 1) * size, size, seq)  # a full chunk's forward: the widest
        x = np.zeros((len(batch), full.length), dtype=np.int32)
        y = np.zeros_like(x)
        scored = []  # (row, window, stream position of its first input) of the documents with a chunk c
        for row, doc in enumerate(batch):
            if c * size < doc.targets:
                w = chunk_window(c, doc.targets, size, seq)
                at = doc.start + w.start
                run = tokens[at : at + w.length + 1]
                x[row, : w.length], y[row, : w.length] = run[:-1], run[1:]
                scored.append((row, w, at))
        train_rows = np.array([(c + 1) * size < doc.targets for doc in batch])  # not a document's last chunk
        nll = ttt.score_then_adapt(adapters, x, y, train_rows, full.offset, size)
        for row, w, at in scored:
            first = at + w.offset + 1  # stream position of the chunk's first target
            yield nll[row, w.offset : w.offset + w.scored], np.arange(first, first + w.scored)


# ------------------------------------------------------------------ the full mode
def score_full(
    backend: Backend, data: EvalData, progress: Progress | None, token_losses: np.ndarray | None
) -> BPBMeter:
    """The full mode: the stream cut into chunks of `ttt_chunk_tokens`; the sliding windows (the evaluation's
    window and stride) whose scored part starts in chunk c are scored, then, unless c is the last chunk,
    every weight (but the first `ttt_freeze_blocks` blocks') trains on chunk c by SGD with momentum, its
    learning rate cosine over the chunks. This rank's sums."""
    # Sliding windows are packaged only for the runs that use them (core/config/features.py: uses_full_ttt).

    cfg = backend.cfg
    tokens = np.asarray(data.tokens)
    total, size, seq = len(tokens) - 1, cfg.ttt_chunk_tokens, cfg.eval_window
    ev = SlidingEval(seq, cfg.eval_stride if cfg.sliding_eval else seq, cfg.ttt_batch_seqs)
    plan = plan_windows(total, seq, ev.stride)
    chunks = -(-total // size)
    chunk_of = np.minimum((plan.starts + plan.score_from) // size, chunks - 1)
    frozen = tuple(f"blocks.{i}." for i in range(min(cfg.ttt_freeze_blocks, cfg.num_layers)))
    ttt = backend.ttt()
    ttt.sgd_reset(cfg.ttt_momentum, frozen)
    meter = BPBMeter()
    for c in range(chunks):
        windows = rank_windows(plan[chunk_of == c], backend.rank, backend.world_size)
        score_windows(meter, tokens, backend.token_losses, data.target_bytes, windows, ev, sink=token_losses)
        if c < chunks - 1:
            lr = cosine(cfg.ttt_lr, c, chunks - 1)
            span = tokens[c * size : (c + 1) * size + 1]
            sgd_over(
                backend, ttt, span, lr, cfg.ttt_epochs, cfg.ttt_batch_seqs, cfg.ttt_grad_clip, doc_mask=True
            )
        if progress is not None:
            progress(c + 1, chunks)
    return meter
