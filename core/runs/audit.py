"""`audit`: whether a run's evaluation scores each token before it learns from it, and what else a
reviewer checks by hand: calibration on training shards only, the bytes, the evaluation time.

The evaluation (the run's own: its config, test-time training included) runs twice in fp32, once on
the validation tokens as they are and once with the second half of one document's tokens permuted
(same length, every BOS in place, so every plan of windows, chunks and batches is the same). Every
scored token's loss is kept, with when it was written: the evaluations write each forward's losses
as they score them (`sink[positions] = losses`), so the order of the writes is the order of scoring.

Let f be the first position whose token changed, and t_f the first write of a loss in the changed
part [f, next BOS]. Checked are the targets outside that part written before t_f, and those written
together with t_f (the same forward) that lie before f in the stream: none of them may have read a
changed token, unless something learnt from a token before scoring it, or a forward read past its
target. Their losses must be equal within `TOLERANCE`. A target written after t_f is not checked: a
legal score-first evaluation may have learnt from the changed tokens by then (the LoRA adapters, the
global phases, the full mode's chunks), and a later window may read them as context.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.common.errors import PgolfError
from core.common.files import file_sha256, read_json
from core.config.fields import Config
from core.eval.bpb import EvalData
from core.eval.score import evaluators
from core.runs.setup import scoring_config, weights_and_data
from core.runs.summary import weights_in
from core.runs.train_script import code_bytes

if TYPE_CHECKING:
    from core.model.backend import Backend

TOLERANCE = 1e-6  # nats: a checked loss may move by this much (fp32)
TRAIN_SHARD = re.compile(r"fineweb_train_\d+\.bin")


class _Stamped(np.ndarray):
    """A loss sink that numbers its writes: `order[i]` is the write that last set entry i (-1: none)."""

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        order = getattr(self, "order", None)
        if order is not None:
            order[index] = self.writes
            self.writes += 1


def scored_losses(
    backend: Backend, data: EvalData, evaluator: Callable[..., Any]
) -> tuple[np.ndarray, np.ndarray, Any]:
    """Each target's loss (NaN where unscored), the write that scored it, and the evaluator's meter."""
    sink = np.full(len(data.tokens), np.nan, dtype=np.float32).view(_Stamped)
    sink.order = np.full(len(data.tokens), -1, dtype=np.int64)
    sink.writes = 0
    meter = evaluator(backend, data, None, sink)
    losses = np.asarray(sink).copy()
    unstamped = np.flatnonzero(~np.isnan(losses) & (sink.order < 0))
    if unstamped.size:
        raise PgolfError(f"audit: the loss of token {unstamped[0]} was written past the sink's own writes")
    return losses, sink.order.copy(), meter


@dataclass(frozen=True)
class Swap:
    """The changed stream: document `document` (its BOS at `start`, the next one at `end`, or the end of
    the tokens) with its tokens from `first` to `end` permuted, the one at `first` changed."""

    tokens: np.ndarray
    sidecar: np.ndarray | None
    document: int
    start: int
    end: int
    first: int


SPREAD = 8  # chunks (of a document or of the stream) are taken to be a multiple of this many tokens


def candidates(tokens: np.ndarray, bos_id: int) -> list[tuple[int, int, int, int]]:
    """(document, its BOS, its end: the next BOS or the end of the tokens, where its change starts) of
    every document with at least two different tokens from about its middle on. The change starts
    mid-chunk: neither at a multiple of `SPREAD` tokens from the document's first target nor from the
    stream's start, so that a chunk scored at once holds changed tokens and unchanged ones before them."""
    starts = np.flatnonzero(np.asarray(tokens) == bos_id)
    ends = [*starts[1:].tolist(), len(tokens)]  # the last document runs to the end of the tokens
    out = []
    for k in range(len(starts)):
        start, end = int(starts[k]), int(ends[k])
        middle = start + 1 + (end - start - 1) // 2
        while (middle - start - 1) % SPREAD == 0 or middle % SPREAD == 0:
            middle += 1
        if end - middle >= 2 and np.unique(tokens[middle:end]).size >= 2:
            out.append((k, start, end, middle))
    return out


def swap_document(data: EvalData, bos_id: int, order: np.ndarray, seed: int) -> Swap:
    """The document whose change starts nearest the middle of the evaluation (in the order of `order`,
    the writes, then of positions), its tokens from there on permuted by a generator seeded with `seed`
    so that the first of them changes."""
    tokens = np.asarray(data.tokens)
    found = candidates(tokens, bos_id)
    if not found:
        raise PgolfError(
            f"audit: no document of the validation tokens can be changed: they need BOS tokens ({bos_id}) "
            "starting documents of a dozen tokens or more (set --bos-id)"
        )
    n = len(tokens)
    rank = np.sort(order[order >= 0] * n + np.flatnonzero(order >= 0))  # by scoring order, then position
    if rank.size == 0:
        raise PgolfError("audit: the evaluation scored no token")
    share = [abs(np.searchsorted(rank, order[middle] * n + middle) / rank.size - 0.5) for *_, middle in found]
    k, start, end, middle = found[int(np.argmin(share))]
    part = tokens[middle:end]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(part))
    if part[perm[0]] == part[0]:  # the first token must change: one of a different value goes first
        other = int(np.flatnonzero(part[perm] != part[0])[0])
        perm[[0, other]] = perm[[other, 0]]
    changed = tokens.copy()
    changed[middle:end] = part[perm]
    sidecar = None
    if data.sidecar is not None:
        sidecar = np.asarray(data.sidecar).copy()
        sidecar[middle:end] = np.asarray(data.sidecar)[middle:end][perm]
    return Swap(changed, sidecar, k, start, end, middle)


@dataclass(frozen=True)
class Check:
    """What comparing the two evaluations found."""

    checked: int  # targets whose loss must not move
    max_change: float  # the largest |loss change| among them (nats)
    leak_position: int | None  # the first checked target (in scoring order) that moved, if any
    leak_document: int | None
    order_changed: bool  # the order of scoring depended on the changed tokens
    later: int = 0  # targets outside the change scored after it began (not checked: they may move)
    later_max_change: float = 0.0  # the largest |loss change| among them


def compare(
    swap: Swap, bos_id: int, tokens: np.ndarray, before: tuple[np.ndarray, np.ndarray],
    after: tuple[np.ndarray, np.ndarray],
) -> Check:  # fmt: skip
    """The check of the module docstring, on (losses, order) of the evaluations before and after."""
    (loss_a, order_a), (loss_b, order_b) = before, after
    replaced = np.zeros(len(loss_a), dtype=bool)
    replaced[swap.first : swap.end + 1] = True  # and the next BOS, predicted from them
    if not (order_a[replaced] >= 0).any():
        raise PgolfError("audit: the evaluation never scored the changed document")
    t_f = int(order_a[replaced & (order_a >= 0)].min())
    positions = np.arange(len(loss_a))
    scored = order_a >= 0
    checked = scored & ~replaced & ((order_a < t_f) | ((order_a == t_f) & (positions < swap.first)))
    diff = np.abs(loss_a.astype(np.float64) - loss_b.astype(np.float64))
    diff[np.isnan(loss_a) != np.isnan(loss_b)] = np.inf
    diff = np.nan_to_num(diff, nan=0.0, posinf=np.inf)
    later = scored & ~replaced & ~checked
    later_max = float(diff[later].max()) if later.any() else 0.0
    diff = np.where(checked, diff, 0.0)
    moved = np.flatnonzero(diff > TOLERANCE)
    position = document = None
    if moved.size:
        position = int(moved[np.lexsort((moved, order_a[moved]))[0]])
        starts = np.flatnonzero(np.asarray(tokens) == bos_id)
        document = int(np.searchsorted(starts, position, side="left") - 1)
    return Check(
        checked=int(checked.sum()),
        max_change=float(diff.max()) if checked.any() else 0.0,
        leak_position=position,
        leak_document=document,
        order_changed=not np.array_equal(order_a, order_b),
        later=int(later.sum()),
        later_max_change=later_max,
    )


def perturbed_scores(
    backend: Backend, params: dict[str, np.ndarray], data: EvalData, evaluator: Callable[..., Any]
) -> tuple[Swap, Check, float, Any]:
    """Score `params` with `evaluator` on `data` as it is and with half a document permuted
    (`swap_document`); the change, what comparing found, the first evaluation's seconds and meter."""
    cfg = backend.cfg
    backend.load_params(params)
    t0 = time.perf_counter()
    before = scored_losses(backend, data, evaluator)
    backend.synchronize()
    seconds = time.perf_counter() - t0
    swap = swap_document(data, cfg.bos_id, before[1], cfg.seed)
    backend.load_params(params)
    after = scored_losses(backend, EvalData(swap.tokens, data.tables, swap.sidecar), evaluator)
    check = compare(swap, cfg.bos_id, data.tokens, before[:2], after[:2])
    return swap, check, seconds, before[2]


@dataclass(frozen=True)
class Calibration:
    """The files GPTQ's Hessians and the artifact fit read (core/train/calibration.py `write_calibration`)."""

    # "none" (no GPTQ, no fit: nothing to record), "training shards only"; else illegal: "not recorded",
    # "empty" (a record naming no file), "names missing files", "reads other files"
    status: str
    shards: list[str]
    bad: list[str]  # the named files missing, or not training shards
    record: str | None  # the file it was read from

    @property
    def legal(self) -> bool:
        return self.status in ("none", "training shards only")

    def problem(self) -> str:
        """What is wrong with the calibration, in a few words ('' when legal)."""
        return {
            "not recorded": "the run used GPTQ or a fit but its calibration record is missing",
            "empty": "the calibration record names no file though the run used GPTQ or a fit",
            "names missing files": f"the calibration record names files that do not exist: {', '.join(self.bad)}",
            "reads other files": f"calibration read files other than training shards: {', '.join(self.bad)}",
        }.get(self.status, "")


def _identity(path: Path) -> tuple[int, int, int]:
    info = path.stat()  # through links: the file itself
    return info.st_dev, info.st_ino, info.st_size


def check_calibration(artifact: Path, cfg: Config, val_path: str | Path | None = None) -> Calibration:
    """What the artifact's `.calibration.json` names: training shards (`fineweb_train_*.bin`) that exist and
    are none of the validation shards, by the file itself (links resolved) and by content (SHA-256), of the
    run's own data (`val_path`: the folder evaluated, default `cfg.data_path`) or the record's folder. A run
    with GPTQ or a fit needs a record naming its files; one without needs none."""
    used = cfg.gptq_enabled or cfg.artifact_fit_bytes > 0
    record = artifact.with_suffix(".calibration.json")
    if not record.exists():  # (a FIFO or a device there is refused by name below)
        return Calibration("not recorded" if used else "none", [], [], None)
    try:
        found = read_json(record, "calibration record", 2**20)
        data_path = Path(found["data_path"])
        lists = [found["gptq_shards"], found.get("fit_shards", [])]
        if not all(isinstance(n, list) and all(isinstance(x, str) for x in n) for n in lists):
            raise TypeError("the shard lists must be lists of file names")
    except (PgolfError, ValueError, KeyError, TypeError) as exc:
        raise PgolfError(f"audit: {record} is not a calibration record ({exc})") from None
    names = list(dict.fromkeys(lists[0] + lists[1]))
    if not names:
        return Calibration("empty" if used else "none", [], [], str(record))
    missing = [n for n in names if not (data_path / n).is_file()]
    if missing:
        return Calibration("names missing files", names, missing, str(record))
    val = {p.resolve() for folder in {Path(val_path or cfg.data_path), data_path} if folder.is_dir()
           for p in folder.glob("fineweb_val_*.bin")}  # fmt: skip
    val_ids = {_identity(v): v for v in val}
    hashes: dict[Path, str] = {}

    def content(path: Path) -> str:
        if path not in hashes:
            hashes[path] = file_sha256(path, "calibration file")
        return hashes[path]

    bad = []
    for name in names:
        path = (data_path / name).resolve()
        ident = _identity(path)
        same = ident in val_ids or any(
            ident[2] == v_id[2] and content(path) == content(v) for v_id, v in val_ids.items()
        )
        if not TRAIN_SHARD.fullmatch(name) or Path(name).name != name or same:
            bad.append(name)
    return Calibration("reads other files" if bad else "training shards only", names, bad, str(record))


@dataclass
class Audit:
    """The result of `audit`, what its table and --json show."""

    artifact: str
    backend: str
    evaluation: str  # the evaluator audited: plain, sliding_window or ttt
    tokens: int  # validation tokens
    document: int
    document_tokens: tuple[int, int]  # stream positions [first, end) permuted
    check: Check
    calibration: Calibration
    artifact_bytes: int
    code_bytes: int
    eval_seconds: float  # the first evaluation's wall time, on this machine
    device: str  # what it ran on
    val_bpb: float
    command: str

    tolerance = TOLERANCE  # how far a checked loss may move (the records folder's README says it)

    @property
    def leak(self) -> bool:
        return self.check.leak_position is not None or self.check.order_changed

    @property
    def legal(self) -> bool:
        return not self.leak and self.calibration.legal

    def verdict(self) -> str:
        """One line: pass, or what failed first."""
        c = self.check
        if c.leak_position is not None:
            return (
                f"LEAK: the loss of token {c.leak_position} (document {c.leak_document}) moved by "
                f"{c.max_change:.3g} nats when only tokens it should not have seen changed (document "
                f"{self.document}, tokens {self.document_tokens[0]}..{self.document_tokens[1] - 1})"
            )
        if c.order_changed:
            return "LEAK: the order the tokens were scored in depended on tokens not yet scored"
        if not self.calibration.legal:
            return self.calibration.problem()
        return "pass"

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(legal=self.legal, verdict=self.verdict(), tolerance=TOLERANCE)
        return out

    def rows(self) -> list[tuple[str, str]]:
        """(what, value): the table `audit` prints and the records folder's README shows."""
        c, cal = self.check, self.calibration
        shards = ", ".join(cal.shards) if len(cal.shards) <= 4 else f"{cal.shards[0]} ... {cal.shards[-1]}"
        return [
            ("artifact", f"{self.artifact} ({self.artifact_bytes:,} B)"),
            ("code (train_gpt.py)", f"{self.code_bytes:,} B"),
            ("total", f"{self.artifact_bytes + self.code_bytes:,} B"),
            (
                "evaluation",
                f"{self.evaluation}, {self.tokens:,} tokens, val_bpb {self.val_bpb:.8f}, "
                f"{self.eval_seconds:.1f} s ({self.backend} on {self.device}, fp32)",
            ),
            (
                "changed",
                f"document {self.document}: tokens {self.document_tokens[0]}..{self.document_tokens[1] - 1} "
                "permuted",
            ),
            ("tokens checked", f"{c.checked:,}"),
            ("largest loss change", f"{c.max_change:.3g} nats (must be <= {TOLERANCE:g})"),
            (
                "scored after the change",
                f"{c.later:,} tokens outside it, not checked: moved up to {c.later_max_change:.3g} nats",
            ),
            ("scoring order", "changed" if c.order_changed else "the same"),
            ("calibration", f"{cal.status}" + (f" ({len(cal.shards)}: {shards})" if cal.shards else "")),
            ("verdict", self.verdict()),
        ]


def rerun_command(path: Path, backend: str, evaluation: str | None, overrides: dict[str, Any]) -> str:
    """The command line that runs the same audit again."""
    parts = ["python", "cli.py", "audit", str(path)]
    if backend != "auto":
        parts += ["--backend", backend]
    if evaluation:
        parts += ["--evaluation", evaluation]
    for name, value in sorted(overrides.items()):
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{flag[2:]}")
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def audit(
    path: Path,
    make_backend: Callable[[Config], Backend],
    backend: str = "auto",
    evaluation: str | None = None,
    overrides: dict[str, Any] | None = None,
    allow_pickle: bool = False,
) -> Audit:
    """Audit the artifact of a run directory (or an artifact): see the module docstring.
    `make_backend` opens the backend that scores (`backend` names it in the rerun command)."""
    overrides = dict(overrides or {})
    artifact = weights_in(path)
    if artifact.suffix == ".safetensors":
        raise PgolfError(f"audit: {path} holds no artifact (final_model.*.pgolf), only a checkpoint")
    _, run_cfg = scoring_config(artifact, None, None, overrides)
    params, cfg, data = weights_and_data(
        artifact, None, None, {"compute_dtype": "float32", **overrides}, allow_pickle
    )
    chosen = evaluators(cfg)
    name = evaluation or list(chosen)[-1]
    if name not in chosen:
        raise PgolfError(f"audit: --evaluation {name}: this run's evaluations are {', '.join(chosen)}")
    engine = make_backend(cfg)
    try:
        if engine.world_size > 1:
            raise PgolfError("audit runs in one process: start it with python, not torchrun")
        swap, check, seconds, meter = perturbed_scores(engine, params, data, chosen[name])
    except BaseException:
        engine.close(failed=True)
        raise
    engine.close()
    machine = str(getattr(engine, "device", "unknown"))
    return Audit(
        artifact=str(artifact),
        backend=getattr(engine, "name", backend),
        evaluation=name,
        tokens=len(data.tokens),
        document=swap.document,
        document_tokens=(swap.first, swap.end),
        check=check,
        calibration=check_calibration(artifact, run_cfg, cfg.data_path),
        artifact_bytes=artifact.stat().st_size,
        code_bytes=code_bytes(run_cfg),
        eval_seconds=seconds,
        device=machine,
        val_bpb=float(meter.val_bpb),
        command=rerun_command(path, backend, evaluation, overrides),
    )
