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

submission.json is checked against a schema (`TOP_FIELDS`, `SEED_FIELDS`: each field the records use,
with the kind of value it must hold), then the relations between its figures and the logs'.
`check_record` returns one line per finding; `seed_figures` gives a record's per-seed figures for a
t-test against it (cli.py runs --against).
"""

from __future__ import annotations

import ast
import datetime
import decimal
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.common.files import MAX_INT_DIGITS, parse_json, read_file, read_text, text_lines
from core.config.fields import BUDGET_BYTES

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
# The code the run counted: `Code size: N bytes`, or the compressed one where a log gives both sizes.
CODE_LINE = re.compile(_STAMP + r"Code size(?: \(compressed\))?:\s*(\d+) bytes")
SEED_LINE = re.compile(_STAMP + r"\s*seed:\s*(\d+)\s*$")
SEED_IN_NAME = re.compile(r"seed_?(\d+)|^train(\d+)$")
MAX_NUMBER_CHARS = 100  # a log's figure written longer than this is no figure


@dataclass
class LogFigures:
    """What one log says: its seed, its final evaluation and its sizes (None where it says nothing)."""

    path: Path
    seed: str | None  # the file name's, else the one the log states
    logged_seeds: set[str]  # the seeds the log itself states (`seed: N` lines)
    tag: str | None = None  # the final evaluation's name
    val_loss: Decimal | None = None
    val_bpb: Decimal | None = None
    total_bytes: int | None = None
    model_bytes: int | None = None
    code_bytes: int | None = None
    # Every evaluation of the artifact: the lines after the last `Total submission size` (all of them
    # in a log without one), as (name, val_loss, val_bpb).
    scores: list[tuple[str, Decimal, Decimal]] = field(default_factory=list)

    @property
    def sizes(self) -> set[int]:
        return {self.total_bytes, self.model_bytes} - {None}


@dataclass
class SeedResult:
    """One seed's figures as submission.json gives them (None where absent or not of their kind)."""

    seed: str
    val_bpb: Decimal | None = None
    val_loss: Decimal | None = None
    total_bytes: int | None = None  # bytes_total, or artifact_bytes (the challenge counts the code in it)
    artifact_bytes: int | None = None
    bytes_total: int | None = None
    code_bytes: int | None = None


@dataclass
class Record:
    path: Path
    submission: dict[str, Any] | None
    seeds: list[SeedResult]  # submission.json's per-seed figures (none for a record of one figure at the top)
    listed_seeds: list[str]  # the seeds it lists (its `seeds`, else its table's keys)
    logs: list[LogFigures]
    findings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ the logs
def read_log(path: Path) -> LogFigures:
    """A log's seed, evaluations and sizes. What a log holds is never an error, but a log that is not a
    readable UTF-8 file, or holds a figure hundreds of digits long, is a PgolfError naming its line."""
    named = SEED_IN_NAME.search(path.stem)
    seed = next((g for g in named.groups() if g), None) if named else None
    figures = LogFigures(path, seed, set())
    for number, line in text_lines(path, "log", MAX_LOG_BYTES):
        if m := SEED_LINE.match(line):
            figures.logged_seeds.add(_digits(m.group(1), path, number))
        elif m := EVAL_LINE.match(line):
            loss, bpb = (Decimal(_digits(m.group(i), path, number)) for i in (2, 3))
            score = (m.group("tag"), loss, bpb)
            figures.tag, figures.val_loss, figures.val_bpb = score
            figures.scores.append(score)
        elif m := TOTAL_LINE.match(line):
            figures.total_bytes = int(_digits(m.group(1), path, number))
            figures.scores = []
        elif m := MODEL_LINE.match(line):
            figures.model_bytes = int(_digits(m.group(1), path, number))
        elif m := CODE_LINE.match(line):
            figures.code_bytes = int(_digits(m.group(1), path, number))
    if figures.seed is None and len(figures.logged_seeds) == 1:
        figures.seed = next(iter(figures.logged_seeds))
    return figures


def _digits(text: str, path: Path, line: int) -> str:
    """A number read from a log, refused when it is far longer than any figure or count."""
    limit = MAX_NUMBER_CHARS if any(c in text for c in ".eE") else MAX_INT_DIGITS
    if len(text) > limit:
        raise PgolfError(f"log {path}: line {line} holds a number of {len(text):,} characters")
    return text


def find_logs(folder: Path) -> list[Path]:
    """The folder's logs: its *.log and *.txt files and those of its subfolders (a logs/ folder, a
    re-evaluation's), not deeper; not requirements.txt. One that is no regular file (a FIFO, a device) is
    listed too: its reader refuses it by name."""
    found = [p for where in (folder, *sorted(d for d in folder.iterdir() if d.is_dir())) for p in sorted(where.iterdir())
             if p.suffix in LOG_SUFFIXES and not p.is_dir() and p.name != "requirements.txt" and not p.name.startswith(".")]  # fmt: skip
    return found


# ------------------------------------------------------------------------ submission.json's schema
MAX_FIGURE = 1000  # a val_loss (nats a token) or val_bpb this high is no model's: a uniform guess is ~11 nats
MAX_BYTES = 10**15  # a byte count past this is no artifact's
MAX_SECONDS = 10**9
MAX_SEED = 2**64


def _number(value: Any) -> Decimal | None:
    """A JSON number as a Decimal (submission.json is read with exact numbers); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        return None
    return Decimal(value) if isinstance(value, int) or value.is_finite() else None


def _within(low: Decimal | int, high: Decimal | int, low_open: bool = False) -> Callable[[Any], bool]:
    def accepts(value: Any) -> bool:
        number = _number(value)
        return number is not None and (low < number if low_open else low <= number) and number < high

    return accepts


def _whole_within(high: int) -> Callable[[Any], bool]:
    in_range = _within(0, high)
    return lambda value: in_range(value) and _number(value) == _number(value).to_integral_value()


def _is_date(value: Any) -> bool:
    """An ISO date (2026-04-27), maybe with a time after it (2026-03-18T14:56:29Z)."""
    try:
        return isinstance(value, str) and bool(datetime.date.fromisoformat(value[:10]))
    except ValueError:
        return False


@dataclass(frozen=True)
class Kind:
    """The kind of value a field must hold: `accepts(value)`, else a finding "<field> is <value>, not <what>"."""

    what: str
    accepts: Callable[[Any], bool]


TEXT = Kind("text", lambda v: isinstance(v, str))
DATE = Kind("a date (YYYY-MM-DD)", _is_date)
FIGURE = Kind(f"a number above 0 and below {MAX_FIGURE:,}", _within(0, MAX_FIGURE, low_open=True))
SPREAD = Kind(f"a number from 0 to {MAX_FIGURE:,}", _within(0, MAX_FIGURE))
GAIN = Kind(f"a number between -{MAX_FIGURE:,} and {MAX_FIGURE:,}", _within(-MAX_FIGURE, MAX_FIGURE))
BYTES = Kind(f"a byte count (a whole number from 0 to {MAX_BYTES:.0e})", _whole_within(MAX_BYTES))
COUNT = Kind("a whole number from 0", _whole_within(MAX_BYTES))
AMOUNT = Kind("a number from 0", _within(0, MAX_BYTES))  # a mean of counts (train_steps_mean)
SECONDS = Kind(f"a time (a number from 0 to {MAX_SECONDS:.0e})", _within(0, MAX_SECONDS))
SEED = Kind("a seed (a whole number from 0)", _whole_within(MAX_SEED))
# An evaluation's time, null where it was not measured (pgolf's package writes that).
SECONDS_OR_NULL = Kind(SECONDS.what + " or null", lambda v: v is None or SECONDS.accepts(v))
TIMES = Kind(
    "a table of times", lambda v: isinstance(v, dict) and all(SECONDS.accepts(t) for t in v.values())
)
SOME_SECONDS = Kind(
    SECONDS.what + " or a list of them",
    lambda v: SECONDS.accepts(v) or (isinstance(v, list) and all(SECONDS.accepts(t) for t in v)),
)

# The headline figures, each under the names the records have used (the first found counts).
BPB_NAMES = ("val_bpb", "mean_val_bpb", "mean_bpb")
LOSS_NAMES = ("val_loss", "mean_val_loss", "mean_val_loss_nats")
CODE_NAMES = ("bytes_code", "code_bytes")


# submission.json's fields, as the challenge's records (and pgolf's package) use them: the kind each holds
# where it is given. The seeds' list and table are checked on their own (`_seed_table`).
def _named(names: str, kind: Kind) -> dict[str, Kind]:
    return dict.fromkeys(names.split(), kind)


TOP_FIELDS: dict[str, Kind] = {
    **_named("author github_id name blurb track hardware pytorch_version technique_summary notes", TEXT),
    "date": DATE,
    **_named(" ".join(BPB_NAMES + LOSS_NAMES), FIGURE),
    **_named(
        "val_loss_nats pre_quant_val_bpb pre_quant_val_loss int6_zstd_val_loss int6_zstd_val_bpb "
        "val_bpb_roundtrip val_loss_roundtrip val_loss_sliding sliding_bpb_mean pre_ttt_sliding_mean "
        "post_ema_mean_bpb quant_roundtrip_mean_bpb",
        FIGURE,
    ),
    **_named("val_bpb_std val_loss_std std_bpb std_val_loss_nats val_loss_nats_std", SPREAD),
    **_named("ttt_gain_mean_bpb quantization_gap_bpb", GAIN),
    **_named(" ".join(CODE_NAMES), BYTES),
    **_named(
        "bytes_total artifact_bytes artifact_bytes_mean artifact_bytes_max artifact_size_bytes "
        "bytes_model_int6_zstd bytes_model_int8_zlib bytes_model_compressed",
        BYTES,
    ),
    **_named("train_steps train_steps_mean step_stop n_seeds model_params", AMOUNT),
    **_named(
        "train_time_seconds wallclock_seconds train_time_s_mean eval_time_s_mean step_avg_ms "
        "step_avg_ms_mean",
        SECONDS,
    ),
    "eval_time_seconds": SOME_SECONDS,
    "seed": SEED,
}
# Each seed's row in the table.
SEED_FIELDS: dict[str, Kind] = {
    **_named("val_bpb val_loss pre_ttt_val_bpb pre_ttt_sliding_bpb", FIGURE),
    "ttt_gain_bpb": GAIN,
    **_named(" ".join(("artifact_bytes", "bytes_total", *CODE_NAMES)), BYTES),
    **_named("steps train_tokens", COUNT),
    **_named(
        "train_time_s train_time_ms ttt_time_ms eval_time_ms ttt_eval_time_s step_avg_ms ms_per_step "
        "gptq_reserve_seconds",
        SECONDS,
    ),
    "eval_time_s": SECONDS_OR_NULL,
    "eval_phases_s": TIMES,
    **_named("hardware source", TEXT),
}


def _shown(value: Any) -> str:
    """A value as a finding quotes it: short, on one line."""
    text = f'"{value}"' if isinstance(value, str) else "an object" if isinstance(value, dict) else (
        "a list" if isinstance(value, list) else "null" if value is None else str(value).lower()
        if isinstance(value, bool) else str(value))  # fmt: skip
    return text if len(text) <= 40 else text[:37] + "..."


def _kind_findings(table: dict[str, Any], kinds: dict[str, Kind], where: str) -> list[str]:
    return [f"{where}{name} is {_shown(table[name])}, not {kind.what}" for name, kind in kinds.items()
            if name in table and not kind.accepts(table[name])]  # fmt: skip


def _first(table: dict[str, Any], *keys: str) -> Any:
    return next((table[k] for k in keys if k in table), None)


def _valid(table: dict[str, Any], kinds: dict[str, Kind], *names: str) -> Decimal | None:
    """The first of `names` in `table`, as a Decimal, when it is a number of its kind; None otherwise."""
    name = next((n for n in names if n in table), None)
    return _number(table[name]) if name is not None and kinds[name].accepts(table[name]) else None


def _size(table: dict[str, Any], kinds: dict[str, Kind], *names: str) -> int | None:
    """The first of `names` in `table` as a byte count, when it is one; None otherwise."""
    number = _valid(table, kinds, *names)
    return None if number is None else int(number)


def mean_bpb(sub: dict[str, Any]) -> Decimal | None:
    return _valid(sub, TOP_FIELDS, *BPB_NAMES)


def _mean_loss(sub: dict[str, Any]) -> Decimal | None:
    return _valid(sub, TOP_FIELDS, *LOSS_NAMES)


def _seed_table(sub: dict[str, Any]) -> tuple[list[SeedResult], list[str], list[str]]:
    """submission.json's per-seed figures in any of the records' shapes, the seeds it lists, and the
    findings about their shape and kinds."""
    findings: list[str] = []
    listed, table = sub.get("seeds"), sub.get("seed_results")
    if table is None and isinstance(listed, dict):  # {"seeds": {"42": {...}}}
        table, listed = listed, None
    seeds: list[str] = []
    if isinstance(listed, list):
        bad = [s for s in listed if not SEED.accepts(s)]
        if bad:
            findings.append(f"submission.json: seeds holds {_shown(bad[0])}, not {SEED.what}")
        seeds = [str(s) for s in listed if SEED.accepts(s)]
    elif listed is not None:
        findings.append(f"submission.json: seeds is {_shown(listed)}, not a list of seeds")
    results: list[SeedResult] = []
    if table is not None and not isinstance(table, dict):
        findings.append(
            f"submission.json: seed_results is {_shown(table)}, not a table of each seed's figures"
        )
    elif table is not None:
        for key, row in table.items():
            if not (key.isascii() and key.isdigit()) or len(key) > 20:
                findings.append(f"submission.json: the seed table's key {_shown(key)} is not a seed")
                continue
            where = f"submission.json: seed {key}'s "
            if not isinstance(row, dict):
                findings.append(f"{where}figures are {_shown(row)}, not a table")
                row = {}
            findings += _kind_findings(row, SEED_FIELDS, where)
            artifact, total = (
                _size(row, SEED_FIELDS, "artifact_bytes"),
                _size(row, SEED_FIELDS, "bytes_total"),
            )
            results.append(SeedResult(key, _valid(row, SEED_FIELDS, "val_bpb"), _valid(row, SEED_FIELDS, "val_loss"),
                                      total if total is not None else artifact, artifact, total,
                                      _size(row, SEED_FIELDS, *CODE_NAMES)))  # fmt: skip
        seeds = seeds or [r.seed for r in results]
    scores = sub.get("seed_scores")
    if scores is not None and not (isinstance(scores, list) and all(FIGURE.accepts(v) for v in scores)):
        findings.append(f"submission.json: seed_scores is {_shown(scores)}, not a list of val_bpb figures")
    elif scores is not None and not results:
        if len(scores) != len(seeds):
            findings.append(f"submission.json: seed_scores has {len(scores)} figures for {len(seeds)} seeds")
        else:
            results = [SeedResult(s, _number(v)) for s, v in zip(seeds, scores, strict=True)]
    return results, seeds, findings


def read_record(folder: str | Path) -> Record:
    """The folder's submission.json and logs, with the findings met while reading them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PgolfError(f"{folder}: no such records folder")
    findings = [f"{name}: missing" if not (folder / name).exists() else f"{name}: not a regular file"
                for name in REQUIRED_FILES if not (folder / name).is_file()]  # fmt: skip
    sub = None
    if (folder / "submission.json").is_file():
        try:
            text = read_text(folder / "submission.json", "submission.json", MAX_JSON_BYTES)
            sub = parse_json(text, "submission.json", exact=True)
            if not isinstance(sub, dict):
                findings.append("submission.json: not a JSON object")
                sub = None
        except PgolfError as exc:  # "submission.json: what", its path left out (the folder names it)
            findings.append(
                str(exc).replace(f"submission.json {folder / 'submission.json'}", "submission.json")
            )
    seeds, listed = [], []
    if sub is not None:
        findings += _kind_findings(sub, TOP_FIELDS, "submission.json: ")
        seeds, listed, shape = _seed_table(sub)
        findings += shape
    logs = []
    for path in find_logs(folder):
        try:
            logs.append(read_log(path))
        except PgolfError as exc:  # named by its place in the folder
            findings.append(str(exc).replace(f"log {path}", str(path.relative_to(folder))))
    return Record(folder, sub, seeds, listed, logs, findings)


# --------------------------------------------------------------------------------- the checks
def _decimals(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return min(max(-exponent, 0), 30) if isinstance(exponent, int) else 0  # past 30: as good as exact


def _half_unit(value: Decimal) -> Decimal:
    return Decimal(5) / Decimal(10) ** (_decimals(value) + 1)


def agree(a: Decimal, b: Decimal) -> bool:
    """Whether two figures are the same number, each written to its own rounding."""
    return abs(a - b) <= _half_unit(a) + _half_unit(b)


def _is_mean(mean: Decimal, values: list[Decimal]) -> bool:
    """Whether `mean` is the mean of `values`, to the roundings of each."""
    computed = sum(values, Decimal(0)) / len(values)
    return abs(computed - mean) <= _half_unit(mean) + max(_half_unit(v) for v in values)


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
        except PgolfError as exc:
            findings.append(str(exc).replace(f"train_gpt.py {script}", "train_gpt.py"))
        except (SyntaxError, ValueError) as exc:
            findings.append(f"train_gpt.py: not valid Python ({str(exc).splitlines()[0]})")
        except (RecursionError, MemoryError):  # the parser's stack, on thousands of nested expressions
            findings.append("train_gpt.py: not valid Python (nested too deeply to parse)")
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
    if mean is None and _first(sub, *BPB_NAMES) is None:
        findings.append("submission.json: no val_bpb")
    if len(set(record.listed_seeds)) != len(record.listed_seeds):
        findings.append(f"submission.json: a seed is listed twice: {record.listed_seeds}")
    total = _size(sub, TOP_FIELDS, "bytes_total")
    if total is not None and total > cap:
        findings.append(
            f"submission.json: bytes_total {total:,} is over the cap of {cap:,} by {total - cap:,}"
        )
    if record.seeds:
        _check_seeds(record, cap)
        _check_means(record, mean, total)
    elif logs:
        _check_top_figures(record, mean, total, cap)
    return findings


def _check_means(record: Record, mean: Decimal | None, total: int | None) -> None:
    """The headline figures against the seeds': val_bpb and val_loss their means, bytes_total their
    largest or their mean, artifact_bytes_mean and artifact_bytes_max theirs."""
    findings, sub, seeds = record.findings, record.submission or {}, record.seeds
    for name, headline, values in (("val_bpb", mean, [s.val_bpb for s in seeds]),
                                   ("val_loss", _mean_loss(sub), [s.val_loss for s in seeds])):  # fmt: skip
        if headline is not None and all(v is not None for v in values) and not _is_mean(headline, values):
            computed = sum(values, Decimal(0)) / len(values)
            findings.append(
                f"submission.json: {name} {headline} is not the mean of its seeds' ({computed:.8f})"
            )
    totals, artifacts = [s.total_bytes for s in seeds], [s.artifact_bytes for s in seeds]
    if total is not None and None not in totals and total != max(totals) and abs(total - _mean(totals)) > 1:
        findings.append(f"submission.json: bytes_total {total:,} is neither its seeds' largest ({max(totals):,}) "
                        f"nor their mean ({_mean(totals):,.0f})")  # fmt: skip
    if None in artifacts:
        return
    largest, mean_size = (
        _size(sub, TOP_FIELDS, "artifact_bytes_max"),
        _size(sub, TOP_FIELDS, "artifact_bytes_mean"),
    )
    if largest is not None and largest != max(artifacts):
        findings.append(f"submission.json: artifact_bytes_max {largest:,} is not its seeds' largest "
                        f"({max(artifacts):,})")  # fmt: skip
    if mean_size is not None and abs(mean_size - _mean(artifacts)) > 1:
        findings.append(f"submission.json: artifact_bytes_mean {mean_size:,} is not its seeds' mean "
                        f"({_mean(artifacts):,.0f})")  # fmt: skip


def _mean(sizes: list[int]) -> Decimal:
    return Decimal(sum(sizes)) / len(sizes)


def _check_top_figures(record: Record, mean: Decimal | None, total: int | None, cap: int) -> None:
    """A record with no per-seed table: a log for each seed it lists; its val_bpb and val_loss one log's
    figures or the mean of one log per seed; its bytes_total one log's size."""
    findings, logs = record.findings, record.logs
    for log in logs:
        if log.total_bytes is not None and log.total_bytes > cap:
            findings.append(f"{log.path.name}: total submission size {log.total_bytes:,} bytes, over the cap "
                            f"of {cap:,} by {log.total_bytes - cap:,}")  # fmt: skip
    seeds = {log.seed for log in logs if log.seed}
    for seed in record.listed_seeds:
        if seed not in seeds:
            findings.append(f"seed {seed}: no log (a file named for the seed, or stating it)")
    loss = _mean_loss(record.submission or {})
    for name, figure, index in (("val_bpb", mean, 2), ("val_loss", loss, 1)):
        if figure is None or any(agree(figure, score[index]) for log in logs for score in log.scores):
            continue
        per_seed: dict[str, Decimal] = {}
        for log in logs:
            if log.seed and log.scores:
                per_seed.setdefault(log.seed, log.scores[-1][index])
        chosen = [per_seed[s] for s in record.listed_seeds if s in per_seed] or list(per_seed.values())
        if not chosen or not _is_mean(figure, chosen):
            shown = ", ".join(f"{log.scores[-1][index]} in {log.path.name}" for log in logs if log.scores)
            findings.append(f"submission.json: {name} {figure} is no log's final figure, nor their mean "
                            f"({shown or 'no log has one'})")  # fmt: skip
    sizes = {size for log in logs for size in log.sizes}
    if total is not None and sizes and total not in sizes:
        shown = ", ".join(f"{log.total_bytes:,} in {log.path.name}" for log in logs if log.total_bytes)
        findings.append(f"submission.json: bytes_total {total:,} is no log's size ({shown})")


def _backs(log: LogFigures, bpb: Decimal) -> bool:
    """Whether the log holds this figure among its evaluations of the artifact (the last one, or another:
    some records report their sliding-window figure and log a test-time-training one after it)."""
    return any(agree(bpb, score[2]) for score in log.scores)


def _check_seeds(record: Record, cap: int) -> None:
    findings, sub = record.findings, record.submission or {}
    by_seed: dict[str, list[LogFigures]] = {}
    for log in record.logs:
        by_seed.setdefault(log.seed or "", []).append(log)
    for seed in sorted(
        set(record.listed_seeds) - {s.seed for s in record.seeds}, key=record.listed_seeds.index
    ):
        findings.append(f"submission.json: seed {seed} is listed without its figures")
    for seed in record.seeds:
        where = f"seed {seed.seed}"
        logs = by_seed.get(seed.seed, [])
        if seed.val_bpb is None:
            findings.append(f"submission.json: {where} has no val_bpb")
        if seed.seed not in record.listed_seeds:
            findings.append(f"submission.json: {where} has figures but is not in its seeds")
        for size in dict.fromkeys((seed.total_bytes, seed.artifact_bytes)):
            if size is not None and size > cap:
                findings.append(f"{where}: {size:,} bytes, over the cap of {cap:,} by {size - cap:,}")
        code = seed.code_bytes
        if code is None:
            code = _size(sub, TOP_FIELDS, *CODE_NAMES)
        if code is None:
            code = next((log.code_bytes for log in logs if log.code_bytes is not None), None)
        if seed.bytes_total is not None and seed.artifact_bytes is not None:
            if code is not None and seed.bytes_total != seed.artifact_bytes + code:
                findings.append(f"{where}: bytes_total {seed.bytes_total:,} is not its artifact_bytes "
                                f"{seed.artifact_bytes:,} + code {code:,}")  # fmt: skip
            elif seed.bytes_total < seed.artifact_bytes:
                findings.append(f"{where}: bytes_total {seed.bytes_total:,} is less than its artifact_bytes "
                                f"{seed.artifact_bytes:,}")  # fmt: skip
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
    sizes = log.sizes
    for size in dict.fromkeys((seed.total_bytes, seed.artifact_bytes)):
        if size is not None and sizes and size not in sizes:
            return f"{size:,} bytes in submission.json, {log.total_bytes or log.model_bytes:,} in {name}"
    return ""


# ------------------------------------------------------------------------- figures for a t-test
def seed_figures(folder: str | Path) -> tuple[list[str], list[float], list[float]]:
    """A record's per-seed (seed, val_loss, val_bpb) for a t-test: from its logs (the seeds submission.json
    lists, else every seed a log names), each seed's evaluation that submission.json reports (its
    figure, to the log's decimals), else its log's last; else from submission.json's table. A figure
    that is no loss (0 or less, or past MAX_FIGURE) is a PgolfError naming the seed."""
    with decimal.localcontext() as context:
        context.clear_traps()
        seeds, losses, bpbs = _seed_figures(Path(folder))
    for seed, loss, bpb in zip(seeds, losses, bpbs, strict=True):
        for name, value in (("val_loss", loss), ("val_bpb", bpb)):
            if not 0 < value < MAX_FIGURE:
                raise PgolfError(
                    f"record {folder}: seed {seed}'s {name} {value.normalize()} is not {FIGURE.what}"
                )
    return seeds, [float(v) for v in losses], [float(v) for v in bpbs]


def _seed_figures(folder: Path) -> tuple[list[str], list[Decimal], list[Decimal]]:
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
        return wanted, [from_logs[s][0] for s in wanted], [from_logs[s][1] for s in wanted]
    rows = [s for s in record.seeds if s.val_loss is not None and s.val_bpb is not None]
    if not rows:
        raise PgolfError(f"{record.path}: no per-seed val_loss and val_bpb in its logs or submission.json")
    return [s.seed for s in rows], [s.val_loss for s in rows], [s.val_bpb for s in rows]
