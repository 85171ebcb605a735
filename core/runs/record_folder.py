"""A challenge records folder read back and checked: pgolf's (`package`) or anyone's.

The challenge asks a record for a README.md, a submission.json (name, GitHub id, val_bpb and
related figures), the train logs its script wrote and the train_gpt.py that wrote them. The
records' submission.json has taken several shapes over time: one run's figures at the top; a
`seed_results` (or `seeds`) table of each seed's val_bpb, val_loss and bytes; a `seeds` list
beside a `seed_scores` list. Their logs differ too: `final_int8_zlib_roundtrip_exact val_loss:…
val_bpb:…` (the baseline), `quantized_ttt_phased val_loss:… val_bpb:…` (later records), some
lines behind a timestamp, most logs opening with the script's own source. A log's evaluations of
the artifact are its lines naming an evaluation, then val_loss and val_bpb, after its last `Total
submission size` (its size); a training step's validation starts with its step number and is none.

`check_record` returns one line per finding; `seed_figures` gives a record's per-seed figures for a
t-test against it (cli.py runs --against).
"""

from __future__ import annotations

import ast
import decimal
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from core.config.fields import BUDGET_BYTES
from core.common.errors import PgolfError
from core.common.files import read_file

REQUIRED_FILES = ("README.md", "submission.json", "train_gpt.py")
LOG_SUFFIXES = (".log", ".txt")
MAX_LOG_BYTES = 64 * 2**20
MAX_JSON_BYTES = 2**20
_STAMP = r"^(?:\d+(?:\.\d+)?\s+)?"  # some records' logs put a timestamp before each line
_NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# An evaluation's name (words), maybe settings (`stride:64`), then its figures; a step's validation
# starts with its step number (`step:100/200 val_loss:…`, `100/200 val_loss: …`) and never matches.
EVAL_LINE = re.compile(_STAMP + r"(?P<tag>[A-Za-z][\w+.-]*(?: [A-Za-z][\w+.-]*)*):?(?:\s+[A-Za-z_]\w*:\S+)*"
                       r"\s+val_loss:\s*" + _NUMBER + r"\s+val_bpb:\s*" + _NUMBER)  # fmt: skip
TOTAL_LINE = re.compile(_STAMP + r"Total submission size[^:\n]*:\s*(\d+) bytes")
MODEL_LINE = re.compile(_STAMP + r"Serialized model \S+:\s*(\d+) bytes")
SEED_LINE = re.compile(_STAMP + r"\s*seed:\s*(\d+)\s*$")
SEED_IN_NAME = re.compile(r"seed_?(\d+)|^train(\d+)$")


@dataclass
class LogFigures:
    """What one log says: its seed, its final evaluation and its total size (None where it says nothing)."""

    path: Path
    seed: str | None  # the file name's, else the one the log states
    logged_seeds: set[str]  # the seeds the log itself states (`seed: N` lines)
    tag: str | None = None  # the final evaluation's name
    val_loss: Decimal | None = None
    val_bpb: Decimal | None = None
    total_bytes: int | None = None
    model_bytes: int | None = None
    # Every evaluation of the artifact: the lines after the last `Total submission size` (all of them
    # in a log without one), as (name, val_loss, val_bpb).
    scores: list[tuple[str, Decimal, Decimal]] = field(default_factory=list)


@dataclass
class SeedResult:
    """One seed's figures as submission.json gives them."""

    seed: str
    val_bpb: Decimal | None = None
    val_loss: Decimal | None = None
    total_bytes: int | None = None  # bytes_total, or artifact_bytes (the challenge counts the code in it)
    bad_bytes: bool = False  # one was given, but is no byte count


@dataclass
class Record:
    path: Path
    submission: dict[str, Any] | None
    seeds: list[SeedResult]  # submission.json's per-seed figures (none for a record of one figure at the top)
    listed_seeds: list[str]  # the seeds it lists (its `seeds`, else its table's keys)
    logs: list[LogFigures]
    findings: list[str] = field(default_factory=list)


def read_log(path: Path) -> LogFigures:
    """A log's seed, evaluations and sizes (core of `check_record`; never an error for what it holds)."""
    text = read_file(path, "log", MAX_LOG_BYTES).decode("utf-8", errors="replace")
    named = SEED_IN_NAME.search(path.stem)
    logged = {m.group(1) for line in text.splitlines() if (m := SEED_LINE.match(line))}
    seed = next((g for g in named.groups() if g), None) if named else None
    if seed is None and len(logged) == 1:
        seed = next(iter(logged))
    figures = LogFigures(path, seed, logged)
    for line in text.splitlines():
        if m := EVAL_LINE.match(line):
            score = (m.group("tag"), Decimal(m.group(2)), Decimal(m.group(3)))
            figures.tag, figures.val_loss, figures.val_bpb = score
            figures.scores.append(score)
        elif m := TOTAL_LINE.match(line):
            figures.total_bytes = int(m.group(1))
            figures.scores = []
        elif m := MODEL_LINE.match(line):
            figures.model_bytes = int(m.group(1))
    return figures


def find_logs(folder: Path) -> list[Path]:
    """The folder's logs: its *.log and *.txt files and those of its subfolders (a logs/ folder, a
    re-evaluation's), not deeper; not requirements.txt."""
    found = [p for where in (folder, *sorted(d for d in folder.iterdir() if d.is_dir())) for p in sorted(where.iterdir())
             if p.suffix in LOG_SUFFIXES and p.is_file() and p.name != "requirements.txt" and not p.name.startswith(".")]  # fmt: skip
    return found


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        return None
    return Decimal(value)


MAX_BYTES = 10**15  # a byte count past this is no artifact's


def _whole(value: Any) -> int | None:
    """A byte count: a whole number in 0..MAX_BYTES, else None."""
    number = _number(value)
    if number is None or not 0 <= number < MAX_BYTES or number != number.to_integral_value():
        return None
    return int(number)


def _first(table: dict[str, Any], *keys: str) -> Any:
    return next((table[k] for k in keys if k in table), None)


def _seed_results(sub: dict[str, Any]) -> tuple[list[SeedResult], list[str]]:
    """submission.json's per-seed figures in any of the records' shapes, and the seeds it lists."""
    listed = sub.get("seeds")
    table = sub.get("seed_results")
    if table is None and isinstance(listed, dict):  # {"seeds": {"42": {...}}}
        table = listed
    seeds = [str(s) for s in listed] if isinstance(listed, list) else []
    results: list[SeedResult] = []
    if isinstance(table, dict):
        for key, row in table.items():
            row = row if isinstance(row, dict) else {}
            size = _first(row, "bytes_total", "artifact_bytes")
            results.append(SeedResult(str(key), _number(row.get("val_bpb")), _number(row.get("val_loss")),
                                      _whole(size), size is not None and _whole(size) is None))  # fmt: skip
        seeds = seeds or [r.seed for r in results]
    elif isinstance(sub.get("seed_scores"), list) and len(sub["seed_scores"]) == len(seeds):
        results = [SeedResult(s, _number(v)) for s, v in zip(seeds, sub["seed_scores"], strict=True)]
    return results, seeds


def mean_bpb(sub: dict[str, Any]) -> Decimal | None:
    return _number(_first(sub, "val_bpb", "mean_val_bpb", "mean_bpb"))


def _mean_loss(sub: dict[str, Any]) -> Decimal | None:
    return _number(_first(sub, "val_loss", "mean_val_loss", "mean_val_loss_nats"))


def read_record(folder: str | Path) -> Record:
    """The folder's submission.json and logs, with the findings met while reading them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PgolfError(f"{folder}: no such records folder")
    findings = [f"{name}: missing" for name in REQUIRED_FILES if not (folder / name).is_file()]
    sub = None
    if (folder / "submission.json").is_file():
        try:
            raw = read_file(folder / "submission.json", "submission.json", MAX_JSON_BYTES)
            sub = json.loads(raw.decode("utf-8"), parse_float=Decimal)
            if not isinstance(sub, dict):
                findings.append("submission.json: not a JSON object")
                sub = None
        except (PgolfError, UnicodeDecodeError, ValueError) as exc:
            findings.append(f"submission.json: not readable JSON ({str(exc).splitlines()[0]})")
    seeds, listed = _seed_results(sub) if sub is not None else ([], [])
    logs = []
    for path in find_logs(folder):
        try:
            logs.append(read_log(path))
        except PgolfError as exc:
            findings.append(str(exc))
    return Record(folder, sub, seeds, listed, logs, findings)


def _decimals(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return min(max(-exponent, 0), 30) if isinstance(exponent, int) else 0  # past 30: as good as exact


def _half_unit(value: Decimal) -> Decimal:
    return Decimal(5) / Decimal(10) ** (_decimals(value) + 1)


def agree(a: Decimal, b: Decimal) -> bool:
    """Whether two figures are the same number, each written to its own rounding."""
    return abs(a - b) <= _half_unit(a) + _half_unit(b)


def check_record(folder: str | Path, cap: int = BUDGET_BYTES) -> list[str]:
    """Every finding about a records folder, one line each (an empty list: it passes). Never raises on
    what the folder holds; only a folder that is not there is an error."""
    with decimal.localcontext() as context:  # absurd figures (1e999999) compare as numbers, not errors
        context.clear_traps()
        return _check_record(folder, cap)


def _check_record(folder: str | Path, cap: int) -> list[str]:
    record = read_record(folder)
    findings, sub, logs = record.findings, record.submission, record.logs
    script = record.path / "train_gpt.py"
    if script.is_file():
        try:
            ast.parse(read_file(script, "train_gpt.py", MAX_LOG_BYTES))
        except (PgolfError, SyntaxError, ValueError) as exc:
            findings.append(f"train_gpt.py: not valid Python ({str(exc).splitlines()[0]})")
    if not logs:
        findings.append("no train log (*.log, *.txt)")
    for log in logs:
        if log.seed is not None and log.logged_seeds and log.seed not in log.logged_seeds:
            findings.append(f"{log.path.name}: named for seed {log.seed}, but the log states seed "
                            f"{', '.join(sorted(log.logged_seeds))}")  # fmt: skip
    if sub is None:
        return findings
    for key, what in (("author", "name"), ("github_id", "GitHub id")):
        if not isinstance(sub.get(key), str) or not sub[key].strip():
            findings.append(f"submission.json: no {key} (the challenge asks for your {what})")
    mean = mean_bpb(sub)
    if mean is None:
        findings.append("submission.json: no val_bpb")
    if len(set(record.listed_seeds)) != len(record.listed_seeds):
        findings.append(f"submission.json: a seed is listed twice: {record.listed_seeds}")
    total = _whole(sub.get("bytes_total"))
    if total is None and sub.get("bytes_total") is not None:
        findings.append(f"submission.json: bytes_total is no byte count: {str(sub['bytes_total'])[:40]}")
    if total is not None and total > cap:
        findings.append(
            f"submission.json: bytes_total {total:,} is over the cap of {cap:,} by {total - cap:,}"
        )
    if record.seeds:
        _check_seeds(record, cap)
        bpbs = [s.val_bpb for s in record.seeds]
        if mean is not None and all(b is not None for b in bpbs):
            computed = sum(bpbs, Decimal(0)) / len(bpbs)
            if abs(computed - mean) > _half_unit(mean) + max(_half_unit(b) for b in bpbs):
                findings.append(f"submission.json: val_bpb {mean} is not the mean of its seeds' "
                                f"({computed:.8f})")  # fmt: skip
    elif logs:
        _check_top_figures(record, mean, total, cap)
    return findings


def _check_top_figures(record: Record, mean: Decimal | None, total: int | None, cap: int) -> None:
    """A record with no per-seed table: a log for each seed it lists; its val_bpb one log's figure or the
    mean of one log per seed; its bytes_total one log's size."""
    findings, logs = record.findings, record.logs
    for log in logs:
        if log.total_bytes is not None and log.total_bytes > cap:
            findings.append(f"{log.path.name}: total submission size {log.total_bytes:,} bytes, over the cap "
                            f"of {cap:,} by {log.total_bytes - cap:,}")  # fmt: skip
    seeds = {log.seed for log in logs if log.seed}
    for seed in record.listed_seeds:
        if seed not in seeds:
            findings.append(f"seed {seed}: no log (a file named for the seed, or stating it)")
    if mean is not None and not any(_backs(log, mean) for log in logs):
        per_seed = {}
        for log in logs:
            if log.seed and log.val_bpb is not None:
                per_seed.setdefault(log.seed, log.val_bpb)
        chosen = [per_seed[s] for s in record.listed_seeds if s in per_seed] or list(per_seed.values())
        average = sum(chosen, Decimal(0)) / len(chosen) if chosen else None
        if average is None or abs(average - mean) > _half_unit(mean) + max(_half_unit(b) for b in chosen):
            shown = ", ".join(f"{log.val_bpb} in {log.path.name}" for log in logs if log.val_bpb is not None)
            findings.append(f"submission.json: val_bpb {mean} is no log's final figure, nor their mean "
                            f"({shown or 'no log has one'})")  # fmt: skip
    sizes = {size for log in logs for size in (log.total_bytes, log.model_bytes) if size is not None}
    if total is not None and sizes and total not in sizes:
        shown = ", ".join(f"{log.total_bytes:,} in {log.path.name}" for log in logs if log.total_bytes)
        findings.append(f"submission.json: bytes_total {total:,} is no log's size ({shown})")


def _backs(log: LogFigures, bpb: Decimal) -> bool:
    """Whether the log holds this figure among its evaluations of the artifact (the last one, or another:
    some records report their sliding-window figure and log a test-time-training one after it)."""
    return any(agree(bpb, score[2]) for score in log.scores)


def _check_seeds(record: Record, cap: int) -> None:
    findings = record.findings
    by_seed: dict[str, list[LogFigures]] = {}
    for log in record.logs:
        by_seed.setdefault(log.seed or "", []).append(log)
    for seed in sorted(
        set(record.listed_seeds) - {s.seed for s in record.seeds}, key=record.listed_seeds.index
    ):
        findings.append(f"submission.json: seed {seed} is listed without its figures")
    for seed in record.seeds:
        where = f"seed {seed.seed}"
        if seed.val_bpb is None:
            findings.append(f"submission.json: {where} has no val_bpb")
        if seed.bad_bytes:
            findings.append(f"submission.json: {where}'s bytes are no byte count")
        if seed.seed not in record.listed_seeds:
            findings.append(f"submission.json: {where} has figures but is not in its seeds")
        if seed.total_bytes is not None and seed.total_bytes > cap:
            findings.append(
                f"{where}: {seed.total_bytes:,} bytes, over the cap of {cap:,} by {seed.total_bytes - cap:,}"
            )
        logs = by_seed.get(seed.seed, [])
        if not logs:
            findings.append(f"{where}: no log (a file named for the seed, or stating it)")
            continue
        _check_against_logs(record, seed, logs, cap, where)


def _check_against_logs(
    record: Record, seed: SeedResult, logs: list[LogFigures], cap: int, where: str
) -> None:
    """A log of the seed must agree with its figures (the first that does settles it); else name the
    nearest disagreement. A log over the cap is a finding either way."""
    findings = record.findings
    for log in logs:
        if log.total_bytes is not None and log.total_bytes > cap:
            findings.append(f"{log.path.name}: total submission size {log.total_bytes:,} bytes, over the cap "
                            f"of {cap:,} by {log.total_bytes - cap:,}")  # fmt: skip
    problems = [_disagreement(seed, log) for log in logs]
    if all(problems):  # the nearest: a log with the seed's val_bpb, if any
        nearest = next((p for p, log in zip(problems, logs, strict=True) if seed.val_bpb is not None
                        and _backs(log, seed.val_bpb)), problems[0])  # fmt: skip
        findings.append(f"{where}: {nearest}")


def _disagreement(seed: SeedResult, log: LogFigures) -> str:
    """Why a log does not back a seed's figures ('' when it does)."""
    name = log.path.name
    if log.val_bpb is None:
        return f"{name} has no final val_bpb"
    if seed.val_bpb is not None and not _backs(log, seed.val_bpb):
        return f"val_bpb {seed.val_bpb} in submission.json, {log.val_bpb} in {name} ({log.tag})"
    score = next((s for s in reversed(log.scores) if seed.val_bpb is None or agree(seed.val_bpb, s[2])), None)
    if seed.val_loss is not None and score is not None and not agree(seed.val_loss, score[1]):
        return f"val_loss {seed.val_loss} in submission.json, {score[1]} in {name} ({score[0]})"
    sizes = {log.total_bytes, log.model_bytes} - {None}
    if seed.total_bytes is not None and sizes and seed.total_bytes not in sizes:
        return (
            f"{seed.total_bytes:,} bytes in submission.json, {log.total_bytes or log.model_bytes:,} in {name}"
        )
    return ""


def seed_figures(folder: str | Path) -> tuple[list[str], list[float], list[float]]:
    """A record's per-seed (seed, val_loss, val_bpb) for a t-test: from its logs (the seeds submission.json
    lists, else every seed a log names), each seed's evaluation that submission.json reports (its
    figure, to the log's decimals), else its log's last; else from submission.json's table."""
    record = read_record(folder)
    wanted = record.listed_seeds or sorted({log.seed for log in record.logs if log.seed})
    claimed = {s.seed: s.val_bpb for s in record.seeds if s.val_bpb is not None}
    top = mean_bpb(record.submission) if record.submission is not None else None
    if not record.seeds and len(wanted) == 1 and top is not None:  # one run's figure at the top
        claimed[wanted[0]] = top
    from_logs: dict[str, tuple[Decimal, Decimal]] = {}
    for seed in wanted:
        scores = [score for log in record.logs if log.seed == seed for score in reversed(log.scores)]
        backing = [score for score in scores if seed in claimed and agree(claimed[seed], score[2])]
        if backing or scores:
            from_logs[seed] = (backing or scores)[0][1:]
    if wanted and len(from_logs) == len(wanted):
        return wanted, [float(from_logs[s][0]) for s in wanted], [float(from_logs[s][1]) for s in wanted]
    rows = [s for s in record.seeds if s.val_loss is not None and s.val_bpb is not None]
    if not rows:
        raise PgolfError(f"{record.path}: no per-seed val_loss and val_bpb in its logs or submission.json")
    return [s.seed for s in rows], [float(s.val_loss) for s in rows], [float(s.val_bpb) for s in rows]
