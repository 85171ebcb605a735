"""The challenge's records folders read for their figures: what each run was set to, how fast it trained,
how much memory and how many bytes it took, how long each evaluation ran.

A records folder (`records/track_10min_16mb/<date>_<name>/`) holds a README, the `train_gpt.py` that ran,
and one or more logs. The logs come in a few formats, all read here:
- March: `step:N/M train_loss:... train_time:Tms step_avg:Ams` lines, the settings in a few `name:value`
  lines, often after a copy of the script itself (whose lines no pattern here matches: each is anchored
  at the start of a line);
- April: a `Hyperparameters:` block of `  name: value` lines, then `N/M train_loss: ... train_time: Tm
  tok/s: R` lines, whose cumulative rate gives the time at step N; some prefix each line with a timestamp;
- the ternary record's `--- Hyperparameters ---` line of `name=value` pairs and `step:N/M loss:... t:Tms`.
A log may hold several runs one after another: each starts before its `model_params:` line.

The settings of a run are, from weakest to strongest: the defaults its script gives the environment
variables (`os.environ.get("NAME", default)`, read from the folder's `train_gpt.py` and any copy in the log),
the `NAME=value` words of the README's run commands, then what the log itself prints.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from core.common.errors import PgolfError
from core.common.files import read_text

MAX_LOG_BYTES = 64 * 2**20  # the longest records log is under 1 MB
LOG_SUFFIXES = (".log", ".txt")
NOT_LOGS = ("requirements.txt",)

TIMESTAMP = re.compile(r"^\d{9,}\.\d+ ")  # a unix time before each line (2026-04-13's logs)
DEFAULT = re.compile(
    r"""(?:environ\.get|getenv|\b_e)\(\s*["']([A-Z][A-Z0-9_]*)["']\s*,\s*([^,()]+?)\s*[,)]"""
)
ENV_WORD = re.compile(r"""(?:^|\s)([A-Z][A-Z0-9_]*)=("[^"]*"|'[^']*'|\S+)""")
KEY_VALUES = re.compile(r"^(?:[a-z_][a-z0-9_]*:[-+\w.]+)(?: [a-z_][a-z0-9_]*:[-+\w.]+)*$")
HPARAM = re.compile(r"^  ([a-z_][a-z0-9_]*): ?(.*)$")
MARCH_STEP = re.compile(r"^step:(\d+)/\d+ (?:train_loss|val_loss)\S* .*?train_time:(\d+)ms")
TERNARY_STEP = re.compile(r"^step:(\d+)/\d+ loss:\S+ t:(\d+)ms")
APRIL_STEP = re.compile(r"^(\d+)/\d+ train_loss: \S+ train_time: \S+ tok/s: (\d+)")
STOP = re.compile(r"^stopping_early: wallclock_cap train_time: ?(\d+)ms step: ?(\d+)/")
SWITCH = re.compile(r"^(?:layer_loop:(?:enabled|phase\d+)|recurrence:activated)(?: at)? step[: ](\d+)")
PEAK = re.compile(r"^peak memory allocated: (\d+) MiB")
PARAMS = re.compile(r"^(?:model_params|params):(\d+)")
SERIALIZED = re.compile(r"^Serialized model (\S+): (\d+) bytes")
TOTAL = re.compile(r"^Total submission size(?: (\S+))?: (\d+) bytes")
CODE = re.compile(r"^Code size(?: \(compressed\))?: (\d+) bytes")
TERNARY_BUDGET = re.compile(r"^budget:(\d+)/\d+")
TERNARY_CODE = re.compile(r"^artifact:\S+ .*code:(\d+)")
EVAL = re.compile(r"^([A-Za-z][\w +-]*?) (?:stride:\d+ )?val_loss:.*?eval_time:(\d+)ms")
VAL_TOKENS = re.compile(r"^(?:val_tokens: ?|val_loader:shards .*tokens:)(\d+)")
GPU = re.compile(r"NVIDIA (H100|H200)\b")
RESULT = re.compile(r"eval_time:|^Total submission|^Serialized model|^peak memory|^total_eval_time")
EVAL_PHASES = ("roundtrip", "sliding", "ttt")


@dataclass
class Phase:
    """A stretch of training at one layout: its steps (first exclusive) and its time a step."""

    start_step: int
    end_step: int
    ms_per_step: float


@dataclass
class RecordRun:
    """One training run of a records log: its settings and the figures it logged."""

    log: str  # the log's path inside the records folder
    # Its settings by source, lower-case name -> value as text: "script" (the folder's train_gpt.py
    # defaults), "log_script" (those of a copy of the script in the log), "readme", "log" (printed).
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    model_params: int | None = None
    world_size: int = 8
    gpu: str | None = None  # "H100" or "H200" where the log shows nvidia-smi's table
    val_tokens: int | None = None
    points: list[tuple[int, float]] = field(default_factory=list)  # (step, training ms at it)
    switches: list[int] = field(default_factory=list)  # steps where the looped layout switched on
    stop: tuple[int, float] | None = None  # (step, ms) where the wallclock cap stopped it
    peak_memory_mib: int | None = None
    varlen: bool = False  # document-masked attention: its warm-up over cu_seqlens buckets is logged
    artifact_bytes: dict[str, int] = field(default_factory=dict)  # format label -> the model's bytes
    total_bytes: int | None = None
    code_bytes: int | None = None
    eval_seconds: dict[str, float] = field(default_factory=dict)  # roundtrip / sliding / ttt

    ORDER = ("script", "log_script", "readme", "log")

    def settings_in(self, order: tuple[str, ...] = ORDER) -> dict[str, str]:
        """The settings, each source in `order` over the ones before it."""
        out: dict[str, str] = {}
        for source in order:
            out.update(self.sources.get(source, {}))
        return out

    @property
    def settings(self) -> dict[str, str]:
        return self.settings_in()

    @property
    def steps(self) -> int | None:
        return self.stop[0] if self.stop else (self.points[-1][0] if self.points else None)

    @property
    def quantized_bytes(self) -> int | None:
        """The compressed model's bytes: the last quantized format the log names."""
        return list(self.artifact_bytes.values())[-1] if self.artifact_bytes else None

    @property
    def quant_label(self) -> str | None:
        return list(self.artifact_bytes)[-1] if self.artifact_bytes else None

    def phases(self) -> list[Phase]:
        """The training phases (split where the looped layout switched on) and each one's ms a step.

        A phase's rate is the slope between its first logged point past its start (the first steps of
        a run are compiling) and its last; a phase with fewer than two points runs from the time its
        start is reached at the previous phase's rate to the run's last point."""
        points = [p for p in self.points if p[0] > 0]
        if self.stop:
            points.append(self.stop)
        points = sorted(
            dict(reversed(points)).items()
        )  # a step's first line: its validation line comes after
        if len(points) < 2:
            return []
        bounds = [0, *self.switches, points[-1][0]]
        phases: list[Phase] = []
        for lo, hi in itertools.pairwise(bounds):
            inside = [(s, t) for s, t in points if lo < s <= hi]
            warm = [(s, t) for s, t in inside if s >= lo + max(10, (hi - lo) // 20)]
            if len(warm) >= 2 and warm[-1][0] > warm[0][0]:
                (s0, t0), (s1, t1) = warm[0], warm[-1]
            elif phases and inside:
                before = [(s, t) for s, t in points if s <= lo]
                s_prev, t_prev = before[-1]
                s0, t0 = lo, t_prev + (lo - s_prev) * phases[-1].ms_per_step
                s1, t1 = inside[-1]
            else:
                continue
            if s1 > s0:
                phases.append(Phase(lo, hi, (t1 - t0) / (s1 - s0)))
        return phases


@dataclass
class RecordFolder:
    """A records folder: its name and the runs of its logs (the last run of each log)."""

    name: str
    runs: list[RecordRun]
    readme: str = ""


def code_defaults(source: str) -> dict[str, str]:
    """The defaults a script gives its environment variables: `os.environ.get("NAME", default)`,
    `os.getenv(...)` and the ternary record's `_e("NAME", default, ...)`, where the default is a literal."""
    out: dict[str, str] = {}
    for name, default in DEFAULT.findall(source):
        try:
            value = ast.literal_eval(default)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        out[name.lower()] = str(value)
    return out


def readme_env(readme: str) -> dict[str, str]:
    """The `NAME=value` words of the README's fenced blocks that run a training (`torchrun` or a script)."""
    out: dict[str, str] = {}
    for block in re.findall(r"```[^\n]*\n(.*?)```", readme, flags=re.S):
        if "torchrun" not in block and "train_gpt" not in block:
            continue
        for name, value in ENV_WORD.findall(block):
            out[name.lower()] = value.strip("\"'")
    return out


def split_runs(lines: list[str]) -> list[list[str]]:
    """A log's lines cut into its runs: each run ends after the last result line before the next
    run's `model_params:` line."""
    starts = [i for i, line in enumerate(lines) if PARAMS.match(line)]
    if len(starts) <= 1:
        return [lines]
    cuts = [0]
    for prev, nxt in itertools.pairwise(starts):
        results = [i for i in range(prev, nxt) if RESULT.search(lines[i])]
        cuts.append(results[-1] + 1 if results else nxt)
    cuts.append(len(lines))
    return [lines[a:b] for a, b in itertools.pairwise(cuts)]


def eval_phase(label: str) -> str | None:
    """The evaluation phase a result line's label names, or None for a diagnostic before quantization
    or a calibration pass."""
    low = label.lower()
    if "pre-quant" in low or "post_ema" in low or "temp_scaling" in low:
        return None
    if "ttt" in low:
        return "ttt"
    if "sliding" in low:
        return "sliding"
    if "roundtrip" in low or "quantized" in low:
        return "roundtrip"
    return None


def read_run(lines: list[str], log: str, sources: dict[str, dict[str, str]]) -> RecordRun:
    """One run's settings and figures from its lines (timestamps already stripped); `sources`: its
    settings from elsewhere (see RecordRun.sources)."""
    run = RecordRun(log=log, sources=dict(sources))
    logged: dict[str, str] = {}
    in_block = False
    for line in lines:
        if line.rstrip() == "Hyperparameters:":
            in_block = True
            continue
        if in_block:
            m = HPARAM.match(line)
            if m:
                logged[m.group(1)] = m.group(2).strip()
                continue
            in_block = False
        if line.startswith("--- Hyperparameters ---"):
            continue
        if re.fullmatch(r"(?:[a-z_][a-z0-9_]*=\S*)(?: [a-z_][a-z0-9_]*=\S*){5,}", line.strip()):
            logged.update(pair.split("=", 1) for pair in line.split())
            continue
        if KEY_VALUES.match(line) and not re.search(r"(?:^| )step:", line):
            logged.update(pair.split(":", 1) for pair in line.split())
        if m := PARAMS.match(line):
            run.model_params = int(m.group(1))
            if line.startswith("params:"):  # the ternary record: "params:N L:.. d:.. ws:.. ga:.."
                for key, name in (("L", "num_layers"), ("d", "model_dim"), ("ws", "world_size")):
                    if k := re.search(rf"\b{key}:(\d+)", line):
                        logged[name] = k.group(1)
        elif m := (MARCH_STEP.match(line) or TERNARY_STEP.match(line)):
            run.points.append((int(m.group(1)), float(m.group(2))))
        elif m := APRIL_STEP.match(line):
            batch = int(
                float(logged.get("train_batch_tokens") or run.settings.get("train_batch_tokens") or 0)
            )
            if batch and int(m.group(2)):
                run.points.append((int(m.group(1)), 1000.0 * int(m.group(1)) * batch / int(m.group(2))))
        elif m := STOP.match(line):
            run.stop = (int(m.group(2)), float(m.group(1)))
        elif m := SWITCH.match(line):
            run.switches.append(int(m.group(1)))
        elif line.startswith("warmup_cu_buckets"):
            run.varlen = True
        elif m := PEAK.match(line):
            run.peak_memory_mib = int(m.group(1))
        elif m := SERIALIZED.match(line):
            run.artifact_bytes[m.group(1)] = int(m.group(2))
        elif m := TOTAL.match(line):
            if m.group(1):
                run.total_bytes = int(m.group(2))
        elif m := (CODE.match(line) or TERNARY_CODE.match(line)):
            run.code_bytes = int(m.group(1))
        elif m := TERNARY_BUDGET.match(line):
            run.total_bytes = int(m.group(1))
        elif m := VAL_TOKENS.match(line):
            run.val_tokens = int(m.group(1))
        elif m := EVAL.match(line):
            phase = eval_phase(m.group(1))
            # A phase logged twice (two strides) counts once, the last; an `_exact` repeat only where it
            # is the phase's one line with a time.
            if phase and (not m.group(1).endswith("_exact") or phase not in run.eval_seconds):
                run.eval_seconds[phase] = int(m.group(2)) / 1000.0
        if m := GPU.search(line):
            run.gpu = run.gpu or m.group(1)
    if run.total_bytes is not None and run.code_bytes is None and run.quantized_bytes is not None:
        run.code_bytes = run.total_bytes - run.quantized_bytes
    if run.quantized_bytes is None and run.total_bytes is not None and run.code_bytes is not None:
        run.artifact_bytes["ternary"] = run.total_bytes - run.code_bytes
    run.sources["log"] = logged
    run.world_size = int(float(run.settings.get("world_size", 8) or 8))
    run.switches = sorted(set(run.switches))
    return run


def read_log(
    text: str, log: str, defaults: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> list[RecordRun]:
    """Every run of one log's text. `defaults`: the script's defaults, which a copy of the script inside
    the log replaces; `env`: the README's settings, over both."""
    lines = [TIMESTAMP.sub("", line) for line in text.splitlines()]
    runs = []
    for part in split_runs(lines):
        embedded = code_defaults("\n".join(part))  # a copy of the script inside the log, if any
        sources = {"script": defaults or {}, "log_script": embedded, "readme": env or {}}
        runs.append(read_run(part, log, sources))
    return [r for r in runs if r.model_params is not None or r.points]


def log_files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in LOG_SUFFIXES and p.name not in NOT_LOGS and "tokenizer" not in p.name
    )


def read_folder(folder: Path) -> RecordFolder:
    """A records folder: the last run of each of its logs, each with the folder's defaults and README."""
    readme = (
        read_text(folder / "README.md", "records folder", MAX_LOG_BYTES)
        if (folder / "README.md").is_file()
        else ""
    )
    defaults: dict[str, str] = {}
    for script in sorted(folder.glob("*.py")):
        defaults.update(code_defaults(read_text(script, "records folder", MAX_LOG_BYTES)))
    env = readme_env(readme)
    runs = []
    for path in log_files(folder):
        found = read_log(
            read_text(path, "records log", MAX_LOG_BYTES), str(path.relative_to(folder)), defaults, env
        )
        if found:
            runs.append(found[-1])
    return RecordFolder(folder.name, runs, readme)


def read_records(root: Path) -> list[RecordFolder]:
    """Every records folder under `root` (a checkout's `records/track_10min_16mb`, the folder above it,
    or the checkout itself), in name order."""
    root = Path(root)
    for candidate in (root / "records" / "track_10min_16mb", root / "track_10min_16mb", root):
        if candidate.is_dir() and any(
            p.is_dir() and (p / "README.md").is_file() for p in candidate.iterdir()
        ):
            folders = [p for p in sorted(candidate.iterdir()) if p.is_dir()]
            return [read_folder(p) for p in folders]
    raise PgolfError(
        f"records: {root}: no records folders (a folder of <date>_<name>/ folders with a README.md)"
    )
