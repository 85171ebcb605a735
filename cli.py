"""pgolf command line: prepare data, train, evaluate, export, verify, benchmark.

Frameworks are imported inside the commands, so `--help` works with neither
PyTorch nor MLX installed. Every user-facing problem ends as one line on stderr
and a non-zero exit.
"""

from __future__ import annotations

import os
import signal

EXIT_CODES = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
EXIT_BROKEN_PIPE = 141  # as a shell reports a writer ended by SIGPIPE


def _quit_at_once(signum, frame):
    """Until `main` takes over, there is nothing to unwind: a signal ends the process with its line."""
    code, line = EXIT_CODES[signum]
    os.write(2, f"{line}\n".encode())
    os._exit(code)


def _catch_signals(handler) -> None:
    """Install `handler` for SIGINT and SIGTERM, except where they are ignored (a background job)."""
    for signum in EXIT_CODES:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


if __name__ == "__main__":  # from the first instant: the imports below take a while
    _catch_signals(_quit_at_once)

# The imports come after the handlers on purpose (ruff's E402 is off for this file).
import atexit
import contextlib
import functools
import inspect
import math
import platform
import sys
import threading
import time
import traceback
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from core.common.errors import OverBudget, PgolfError, first_line, one_line, out_of_memory
from core.common.launch import launch
from core.config.fields import Config
from core.config.presets import PRESETS
from core.runs.stats import RECORD_MARGIN_NATS, RECORD_P_VALUE

try:  # recent typer releases carry their own copy of click
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors
# A bare group command raises this (click >= 8.2) to show its help; older clicks just print it.
NO_ARGS_IS_HELP = getattr(click_errors, "NoArgsIsHelpError", ())

app = typer.Typer(
    help="Train small GPTs under the Parameter Golf rules, with PyTorch (cuda) or MLX.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Datasets: build the embedded default corpus.", no_args_is_help=True)
app.add_typer(data_app, name="data")
config_app = typer.Typer(
    help="Configs: the resolved settings and where each comes from.", no_args_is_help=True
)
app.add_typer(config_app, name="config")
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
# A warning (an artifact without a checksum, a pickle being opened) is one line too, not a source excerpt.
warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"


# ----------------------------------------------------------------- config flags
def _field_help() -> dict[str, str]:
    """The one-line meaning of each Config field, used as its --flag help."""
    return {f.name: f.metadata.get("help", "") for f in fields(Config)}


def config_flags(command):
    """Give a command one --flag per Config field; they arrive as `overrides`."""
    helps = _field_help()
    defaults = Config()
    signature = inspect.signature(command)
    params = [p for p in signature.parameters.values() if p.name != "overrides"]
    for f in fields(Config):
        kind = type(getattr(defaults, f.name))
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:  # a pair: --tie-embeddings / --no-tie-embeddings
            flag = f"{flag}/--no-{flag[2:]}"
        option = typer.Option(None, flag, help=helps.get(f.name, ""), rich_help_panel="Config fields")
        params.append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind | None)
        )

    @functools.wraps(command)
    def wrapper(**kwargs: Any):
        names = {f.name for f in fields(Config)}
        overrides = {k: v for k, v in kwargs.items() if k in names and v is not None}
        rest = {k: v for k, v in kwargs.items() if k not in names}
        return command(overrides=overrides, **rest)

    wrapper.__signature__ = signature.replace(parameters=params)
    return wrapper


WEIGHTS_ARG = typer.Argument(..., help="Artifact (.pgolf, upstream .ptz) or checkpoint (.safetensors).")
SAMPLE_WEIGHTS = typer.Argument(
    ..., help="Artifact, checkpoint, or run directory (its artifact, else its newest checkpoint)."
)
EVAL_PRESET = typer.Option(
    None,
    help="Config preset for the model, data and eval settings (default: the run's own: the checkpoint's, "
    "the config.json beside the artifact, or what the artifact keeps; else baseline).",
)
CONFIG_FILE = typer.Option(
    None,
    help="TOML file of config fields, or JSON (*.json, e.g. a run's config.json), applied over the preset.",
)
BACKEND = typer.Option(
    "auto", help="cuda (PyTorch: CUDA, else CPU; 'torch' also works), mlx, or auto (MLX on Apple silicon)."
)
PRESET = typer.Option("baseline", help=f"Starting config: {', '.join(PRESETS)}.")
ALLOW_PICKLE = typer.Option(False, help="Allow the upstream MLX pickle container (can run code!).")


# --------------------------------------------------------------------- backends
@contextlib.contextmanager
def opened_backend(name: str, cfg: Config):
    """A backend for the length of a command, holding its one config; its process group is
    released however the command ends. A rank of a distributed job that fails ends its
    process here, which lets the launcher stop the other ranks (`_end_failed_rank`)."""
    from core.model import backend as backends

    engine = backends.create(name, cfg)
    try:
        yield engine
    except BaseException as exc:
        first = engine.close(failed=True)
        if engine.world_size > 1:
            _end_failed_rank(engine.rank, exc, first)
        raise
    engine.close()


def _end_failed_rank(rank: int, exc: BaseException, first: int | None) -> NoReturn:
    """Show this rank's error, unless another rank failed first, and end the process now.

    Not through the interpreter's exit, which waits on the process group's threads, stuck in a
    collective with a rank that is gone: once this process has ended, the launcher (torchrun)
    stops the other ranks within seconds. The exception has already unwound what was being written.
    """
    code, line = _ending(exc)
    if first is not None and first != rank and not isinstance(exc, (Terminated, KeyboardInterrupt)):
        code, line = 1, f"stopped: rank {first} failed first"
    if line is None:  # a bug: its traceback, each line marked with the rank, written out here and now
        text = "".join(traceback.format_exception(exc)).rstrip("\n")
        sys.stderr.write("".join(f"[rank{rank}]: {part}\n" for part in text.split("\n")))
    else:
        err_console.print(f"[rank{rank}]: {line}", markup=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _ensure_default_data(cfg: Config) -> None:
    """Prepare the embedded corpus on first use, when the default dataset is asked for
    (torchrun's other ranks wait for local rank 0 in core.runs.setup.default_data_to_prepare)."""
    from core.runs.setup import default_data_to_prepare

    root = default_data_to_prepare(cfg)
    if root is not None:
        console.print("[bold]No dataset yet: preparing the embedded corpus (one time, about a minute).[/]")
        _prepare(root, cfg.vocab_size)


def _prepare(out: Path, vocab_size: int, case_ops: bool = False) -> dict:
    from core.datasets.embedded import prepare_sotu

    with console.status("preparing") as status:
        summary = prepare_sotu(
            out, vocab_size=vocab_size, progress=lambda msg: status.update(msg), case_ops=case_ops
        )
    return summary


def _log_line(line: str) -> None:
    console.print(line, markup=False)


class LiveProgress:
    """One live display per command: a bar for each thing under way (training steps, a
    validation pass), with the log lines printed above it. None when output is piped."""

    def __init__(self, enabled: bool = True):
        self.bars = None
        if enabled and console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bars = Progress(
                TextColumn("[dim]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("[dim]left"), TimeRemainingColumn(), console=console, transient=True,
            )  # fmt: skip
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> LiveProgress:
        if self.bars is not None:
            self.bars.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bars is not None:
            self.bars.stop()

    def tracker(self, name: str):
        """A (done, total) callback that draws the bar `name`, removed once done reaches total."""
        if self.bars is None:
            return None

        def update(done: int, total: int) -> None:
            if name not in self.tasks:
                self.tasks[name] = self.bars.add_task(name, total=total)
            self.bars.update(self.tasks[name], completed=done, total=total)
            if done >= total:
                self.bars.remove_task(self.tasks.pop(name))
                self.bars.refresh()

        return update


# --------------------------------------------------------------------- commands
@data_app.command("prepare")
def data_prepare(
    out: Path = typer.Option(Path("data"), help="Root folder: datasets/, tokenizers/, manifest.json."),
    docs: Path | None = typer.Option(
        None,
        help="Make the dataset from these documents instead of the embedded corpus: JSON lines with a "
        '"text" field (the challenge\'s docs_selected.jsonl) or a folder of .txt files (docs/tokenizers.md).',
    ),
    vocab_size: int | None = typer.Option(None, help="SentencePiece BPE vocabulary size [default: 1024]."),
    val_docs: int | None = typer.Option(
        None, help="With --docs: the first N documents are validation [default: 50000, the challenge's]."
    ),
    shard_tokens: int | None = typer.Option(
        None, help="With --docs: tokens per shard [default: 100000000, the challenge's]."
    ),
    name: str | None = typer.Option(
        None,
        help="With --docs: the dataset's name, its tokenizer tokenizers/NAME.model [default: <docs>_sp<V>].",
    ),
    tokenizer: Path | None = typer.Option(
        None, help="With --docs: encode with this SentencePiece .model instead of training one."
    ),
    tokenizer_train_docs: int | None = typer.Option(
        None,
        help="With --docs: train the tokenizer on the first N documents only, as the challenge's exporter's "
        "option (its published tokenizers: 5000000) [default: all].",
    ),
    caseops: bool = typer.Option(
        False,
        "--caseops",
        help="The lossless case transform, its tokenizer and the validation byte sidecar: sotu_sp<V>_caseops "
        "from the embedded corpus (train on it with --dataset sotu_sp<V>_caseops), or from --docs.",
    ),
) -> None:
    """Build a dataset and its tokenizer offline: the embedded default (State of the Union speeches),
    or with --docs from any documents, as the challenge's exporter makes its own."""
    if docs is None:
        flags = (("--val-docs", val_docs), ("--shard-tokens", shard_tokens), ("--name", name),
                 ("--tokenizer", tokenizer), ("--tokenizer-train-docs", tokenizer_train_docs))  # fmt: skip
        given = [flag for flag, value in flags if value is not None]
        if given:
            raise typer.BadParameter(
                f"{given[0]} goes with --docs FILE (the embedded corpus has its own split)"
            )
        summary = _prepare(out, 1024 if vocab_size is None else vocab_size, caseops)
    else:
        from core.datasets.prepare import SHARD_TOKENS, VAL_DOCS, prepare_docs

        with console.status("preparing") as status:
            summary = prepare_docs(
                docs, out, name, vocab_size, VAL_DOCS if val_docs is None else val_docs,
                SHARD_TOKENS if shard_tokens is None else shard_tokens, tokenizer, caseops,
                progress=lambda msg: status.update(msg), tokenizer_train_docs=tokenizer_train_docs,
            )  # fmt: skip
    for key, value in summary.items():
        console.print(f"{key}: {value}")


@data_app.command("download")
def data_download(
    out: Path = typer.Option(Path("data"), help="Root folder: datasets/, tokenizers/, manifest.json."),
    variant: str = typer.Option(
        "sp1024",
        help="Tokenization: sp<VOCAB> (e.g. sp1024), byte260, or another of the repo's "
        "(sp8192_lossless_caps_caseops_v1_reserved: CaseOps, with its byte sidecar).",
    ),
    train_shards: int = typer.Option(80, help="How many train shards (1e8 tokens each) to fetch."),
    repo_id: str = typer.Option(
        "willdepueoai/parameter-golf",
        envvar="MATCHED_FINEWEB_REPO_ID",
        help="Hugging Face dataset repo (e.g. kevclark/parameter-golf for record 2026-04-01's sp4096).",
    ),
) -> None:
    """Download the challenge's FineWeb shards and tokenizer (files already present are kept)."""
    from core.datasets.fineweb import download_fineweb

    with console.status("downloading") as status:
        summary = download_fineweb(
            out, variant, train_shards, repo_id, progress=lambda msg: status.update(msg)
        )
    for key, value in summary.items():
        console.print(f"{key}: {value}")


@data_app.command("verify")
def data_verify(
    dataset: str = typer.Argument("sotu_sp1024", help="A dataset listed in the data folder's manifest.json."),
    out: Path = typer.Option(Path("data"), help="Root folder: datasets/, tokenizers/, manifest.json."),
    bytes_: bool = typer.Option(
        False,
        "--bytes",
        help="Prove the validation byte counts instead: what scoring counts against the documents' own "
        "bytes, document by document (exit 1 on any difference), and what the challenge's tables would count.",
    ),
    docs: Path | None = typer.Option(
        None, help="With --bytes: the documents, for data whose manifest entry does not name them."
    ),
    val_docs: int | None = typer.Option(
        None, help="With --bytes and --docs: how many are validation [default: 50000, the challenge's]."
    ),
) -> None:
    """Check a dataset's tokenizer and every shard against the SHA-256 its manifest entry recorded. It reads every
    byte (830 MB/s hashed on a 2-core CPU: 20 s for 16 GB in the page cache, else the disk's pace);
    training itself checks only each shard's header and size. With --bytes, prove its byte counts."""
    if not bytes_ and (docs is not None or val_docs is not None):
        raise typer.BadParameter(f"{'--docs' if docs is not None else '--val-docs'} goes with --bytes")
    if val_docs is not None and val_docs < 1:
        raise typer.BadParameter(f"--val-docs must be at least 1, got {val_docs}")
    if bytes_:
        from core.datasets.byte_proof import verify_bytes

        with console.status("verifying bytes") as status:
            proof = verify_bytes(out, dataset, docs, val_docs, progress=lambda msg: status.update(msg))
        for line in proof.lines:
            console.print(line, markup=False)
        if not proof.exact:
            raise typer.Exit(1)
        return
    from core.data.manifest import verify_dataset

    with console.status("verifying") as status:
        summary = verify_dataset(out, dataset, progress=lambda msg: status.update(msg))
    for key, value in summary.items():
        console.print(f"{key}: {value}")


@app.command()
@config_flags
def train(
    backend: str = BACKEND,
    preset: str = PRESET,
    config: Path | None = CONFIG_FILE,
    resume: Path | None = typer.Option(
        None,
        help="Go on with a run: its directory (its newest checkpoint) or a checkpoint. The checkpoint's "
        "config is used; only the length, cadences and execution settings may be given anew.",
    ),
    seeds: str = typer.Option(
        "", help="Comma-separated seeds: one run per seed with the same config, grouped (runs --compare)."
    ),
    overrides: dict | None = None,
) -> None:
    """Train a model, validate it, export its artifact and score its round trip.

    Config fields come from the preset, then --config, then upstream environment
    variables (ITERATIONS, MATRIX_LR, ...), then the flags below. Ctrl-C (or SIGTERM)
    writes a checkpoint after the current step; a second Ctrl-C quits at once.
    """
    from core.runs.setup import training_runs

    configs, resume, notes = training_runs(backend, preset, config, overrides or {}, resume, seeds)
    over: OverBudget | None = None
    for number, cfg in enumerate(configs, 1):
        try:
            _train_one(backend, cfg, resume, notes)
        except OverBudget as exc:  # the other seeds still run (they may fit); the status is 3 at the end
            over = exc
            if number < len(configs):
                err_console.print(one_line(exc), markup=False)
    if over is not None:
        raise over


def _train_one(backend: str, cfg: Config, resume: Path | None, notes: list[str]) -> None:
    """One training run of `cfg` (checked), with its progress display and closing line."""
    from core.runs.plan import on_target, target_line
    from core.runs.summary import val_curve
    from core.runs.train_script import code_bytes
    from core.train.loop import check_budget
    from core.train.managed import train_managed as run_training
    from core.train.report import report_targets

    report_targets(cfg.report_to)
    _ensure_default_data(cfg)
    reference = val_curve(cfg.abort_behind) if cfg.abort_behind else ()
    with opened_backend(backend, cfg) as engine, LiveProgress(engine.rank == 0) as live:
        if engine.rank == 0 and not on_target(engine.device, engine.world_size):
            notes = [*notes, target_line(cfg)]  # what the config would cost on the challenge's machine
        # One process stops between steps, after a checkpoint; ranks of a job stop at once (see main).
        held = SIGNALS.held() if engine.world_size == 1 else contextlib.nullcontext()
        with held as stop:
            result = run_training(
                engine, resume=resume, log=_log_line, progress=live.tracker("validating"),
                step_progress=live.tracker("training"), notes=notes, stop=stop, code_bytes=code_bytes,
                reference=reference,
            )  # fmt: skip
    if engine.rank == 0:
        sliding = "".join(
            f", {bpb:.4f} {how}"
            for bpb, how in (
                (result.sliding_val_bpb, "with sliding windows"),
                (result.ttt_val_bpb, "with test-time training"),
            )
            if bpb is not None
        )
        console.print(
            f"[bold green]done[/] val_bpb {result.roundtrip_val_bpb:.4f} after the artifact round trip"
            f"{sliding} ({result.val_bpb:.4f} before); artifact {result.artifact_bytes:,} B + code "
            f"{result.code_bytes:,} B; evaluated in {result.eval_time_s:.1f} s; run in {result.run_dir}"
        )
        check_budget(result, cfg.budget_bytes)  # the last line, and exit status 3, when over the cap


@config_app.command("show")
@config_flags
def config_show(
    preset: str = PRESET,
    config: Path | None = CONFIG_FILE,
    overrides: dict | None = None,
) -> None:
    """Print the resolved config as TOML (usable as --config), each value with where it came from;
    a setting train or eval would refuse is refused here too (the same check)."""
    import json

    from core.config.sources import resolve_sources

    cfg, sources = resolve_sources(preset, config, overrides or {})
    cfg.validate()
    for name, value in cfg.to_dict().items():
        text = str(value).lower() if isinstance(value, bool) else json.dumps(value)
        console.print(f"{name} = {text}  # {sources[name]}", markup=False)


@app.command("eval")
@config_flags
def eval_command(
    path: Path = WEIGHTS_ARG,
    backend: str = BACKEND,
    preset: str = EVAL_PRESET,
    config: Path | None = CONFIG_FILE,
    allow_pickle: bool = ALLOW_PICKLE,
    save_token_losses: Path | None = typer.Option(
        None,
        help="Also write the final figure's loss (nats) and byte count of every validation token, in "
        "stream order, to this .npz file (arrays `losses`, `bytes`).",
    ),
    overrides: dict | None = None,
) -> None:
    """Score an artifact or checkpoint on the validation split: val_loss and val_bpb, over
    non-overlapping sequences, with --eval-stride with sliding windows, and with --ttt-enabled with
    test-time training."""
    from core.eval.score import evaluators, figure_protocol
    from core.eval.token_losses import save_token_losses as save_losses
    from core.eval.verify import require_finite
    from core.runs.setup import weights_and_data

    if save_token_losses is not None:
        save_token_losses = _output_file(save_token_losses, ".npz", "--save-token-losses")
    params, cfg, data = weights_and_data(path, preset, config, overrides, allow_pickle)
    meters = {}
    with opened_backend(backend, cfg) as engine:
        engine.load_params(params)
        with LiveProgress(engine.rank == 0) as live:
            chosen = evaluators(cfg)
            for name, evaluator in chosen.items():
                tracker = live.tracker(name.replace("_", " "))
                if save_token_losses is not None and name == list(chosen)[-1]:
                    meter = save_losses(engine, data, evaluator, save_token_losses, tracker)
                else:
                    meter = evaluator(engine, data, tracker)
                meters[name] = require_finite(meter, f"eval of {path} ({name})")
    if engine.rank == 0:
        for name, meter in meters.items():
            console.print(
                f"backend:{engine.name} eval:{name} tokens:{int(meter.tokens)} "
                f"val_loss:{meter.val_loss:.8f} val_bpb:{meter.val_bpb:.8f} protocol:{figure_protocol(name, cfg)}"
            )
        if save_token_losses is not None:
            console.print(f"token losses of eval:{list(meters)[-1]} written to {save_token_losses}")


@app.command()
@config_flags
def audit(
    path: Path = typer.Argument(..., help="Run directory (its artifact and config.json) or artifact."),
    backend: str = BACKEND,
    evaluation: str | None = typer.Option(
        None,
        help="Which of the run's evaluations: plain, sliding_window or ttt (default: the last, its score).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    allow_pickle: bool = ALLOW_PICKLE,
    overrides: dict | None = None,
) -> None:
    """Check that a run's evaluation scores every token before learning from it: its artifact scored
    twice in fp32 with the run's own settings (test-time training included), the second time with half
    a document's tokens permuted; no token scored before them may move. Also: calibration read only
    training shards, artifact and code bytes, evaluation time. Exit 0: legal; 1: a leak (named)."""
    import functools
    import json

    from rich.table import Table

    from core.model.backend import create
    from core.runs.audit import audit as run_audit

    result = run_audit(path, functools.partial(create, backend), backend, evaluation, overrides, allow_pickle)
    if json_out:
        console.print_json(json.dumps(result.to_json()))
    else:
        table = Table(title=f"audit of {path}", show_header=False)
        table.add_column("what")
        table.add_column("value", overflow="fold")
        for what, value in result.rows():
            table.add_row(what, value)
        console.print(table)
        console.print(f"rerun: {result.command}", markup=False)
    if not result.legal:
        raise PgolfError(f"audit: {result.verdict()}")


def _output_file(path: Path, suffix: str, flag: str) -> Path:
    """A file a command will write, checked before any work: its name, and that it can be written."""
    from core.runs.setup import check_writable

    if path.suffix != suffix:
        raise PgolfError(f"{flag} {path}: the file name should end with {suffix}")
    return check_writable(path, flag)


@app.command()
@config_flags
def sample(
    path: Path = SAMPLE_WEIGHTS,
    prompt: str = typer.Option("", help="Text to continue (default: the start of a document)."),
    max_tokens: int = typer.Option(200, help="Most tokens to generate (it stops early at a document start)."),
    temperature: float = typer.Option(0.8, help="Softmax temperature; 0 = greedy (always the likeliest)."),
    top_k: int = typer.Option(50, help="Draw among the k likeliest tokens; 0 = all."),
    backend: str = BACKEND,
    preset: str = EVAL_PRESET,
    config: Path | None = CONFIG_FILE,
    allow_pickle: bool = ALLOW_PICKLE,
    overrides: dict | None = None,
) -> None:
    """Generate text from an artifact or a checkpoint (--seed seeds the draws)."""
    from core.eval.sample import generate
    from core.runs.setup import weights_and_tokenizer

    params, cfg, sp = weights_and_tokenizer(path, preset, config, overrides, allow_pickle)
    ids = [sp.bos_id(), *sp.encode(prompt)]  # documents start with BOS in the shards
    with opened_backend(backend, cfg) as engine:
        engine.load_params(params)
        tokens = generate(engine.decoder(), ids, max_tokens, temperature, top_k, cfg.seed, sp.bos_id())
        console.print(prompt, end="", markup=False)
        shown = sp.decode(ids[1:])  # the prompt as the tokenizer reads it back (spaces normalized)
        for token in tokens:  # printed as they come: the text of all so far, less what was shown
            ids.append(token)
            text = sp.decode(ids[1:])
            console.print(text[len(shown) :], end="", markup=False)
            shown = text
        console.print()


@app.command()
@config_flags
def verify(
    path: Path = WEIGHTS_ARG,
    preset: str = EVAL_PRESET,
    config: Path | None = CONFIG_FILE,
    allow_pickle: bool = ALLOW_PICKLE,
    overrides: dict | None = None,
) -> None:
    """Score one artifact with every installed backend and check that they agree."""
    from rich.table import Table

    from core.config.fields import BUDGET_BYTES
    from core.eval import verify as check
    from core.runs.setup import installed_backends, weights_and_data

    params, cfg, data = weights_and_data(path, preset, config, overrides, allow_pickle)
    verdict = check.verify(params, cfg, data, installed_backends())
    size = path.stat().st_size
    table = Table(title=f"{path} ({size:,} B of the {BUDGET_BYTES:,} B budget, before code)")
    kinds = list(verdict.scores[0].figures) if verdict.scores else []
    titles = {"plain": "", "sliding_window": "sliding ", "ttt": "ttt "}
    for column in ["backend", "device", "tokens"] + [
        f"{titles.get(k, k)}{m}" for k in kinds for m in ("val_loss", "val_bpb")
    ]:
        table.add_column(column, no_wrap=True)
    for s in verdict.scores:
        figures = [f"{v:.8f}" for k in kinds for v in s.figures[k]]
        table.add_row(s.backend, s.device, f"{s.tokens:,}", *figures)
    console.print(table)
    diffs = "; ".join(
        f"{titles.get(k, k)}{diff:.2e} (tolerance {check.bpb_tolerance(k):.0e})"
        for k, diff in verdict.bpb_diffs.items()
    )
    console.print(
        f"max |val_bpb diff|: {diffs}; "
        f"max |logit diff| {verdict.max_logit_diff:.2e} (tolerance {check.LOGIT_TOLERANCE:.0e})"
    )
    if len(verdict.scores) < 2:
        console.print("[yellow]only one backend installed: nothing to compare against[/]")
    if not verdict.agree:
        raise PgolfError("backends disagree beyond tolerance")
    console.print("[bold green]backends agree[/]")


@app.command("export")
@config_flags
def export_command(
    checkpoint: Path = typer.Argument(..., help="Checkpoint written by `train` (.safetensors)."),
    out: Path | None = typer.Option(None, help="Output file (default: beside the checkpoint)."),
    format: str = typer.Option(
        "pgolf", help="pgolf (no pickle) or upstream (torch.save+zlib, int8 only, for train_gpt.py)."
    ),
    backend: str = typer.Option(
        "cuda", help="Who runs GPTQ's calibration and the fit's scoring: cuda or mlx."
    ),
    config: Path | None = typer.Option(
        None, help="A config file (e.g. a fit's .fit.toml): its artifact, data and execution settings."
    ),
    fit_bytes: int = typer.Option(
        0,
        min=0,
        help="Choose the settings with the lowest calibration loss whose artifact + code fit in N bytes.",
    ),
    fit_margin: int = typer.Option(
        0,
        min=0,
        help="Aim this many bytes under --fit-bytes, so that other seeds' artifacts fit too (they drift: "
        "docs/submitting.md).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    overrides: dict | None = None,
) -> None:
    """Write the artifact of a checkpoint and report where its bytes go, class by class.

    The checkpoint's own config decides the artifact (the moving average of the weights
    when the run kept one, as `train` exports); the artifact settings can be changed with
    their flags (--quant-format mixed --matrix-bits 6 --compressor brotli --byte-shuffle 2
    --gptq-enabled ...). GPTQ's calibration reads the run's training data. --fit-bytes N
    searches the settings (bits and clips per class, GPTQ, LQER, compressor) scored on the
    training data's last tokens, and writes beside the artifact the candidates tried
    (<artifact>.fit.json) and the chosen config (<artifact>.fit.toml).
    """
    import json

    from core.artifact.budget import export_budget, format_budget
    from core.artifact.export import export_artifact, quant_label
    from core.config.features import uses_gptq
    from core.runs.setup import export_setup
    from core.runs.train_script import code_bytes
    from core.train.calibration import calibrate_gptq
    from core.train.loop import train_loader

    if fit_bytes:
        overrides = {**(overrides or {}), "artifact_fit_bytes": fit_bytes}
    if fit_margin:
        overrides = {**(overrides or {}), "artifact_fit_margin": fit_margin}
    job = export_setup(checkpoint, out, format, overrides, config)
    cfg, hessians, fit, target = job.cfg, None, None, job.target
    say = None if json_out else console.print
    if cfg.artifact_fit_bytes and job.upstream:
        raise PgolfError("--fit-bytes writes pgolf's mixed format: drop --format upstream")
    if uses_gptq(cfg) or cfg.artifact_fit_bytes:
        with opened_backend(backend, cfg.replace(compile="off")) as engine:
            engine.load_params(job.params)
            engine.set_looping(cfg.num_loops > 0)
            hessians = calibrate_gptq(engine, train_loader(cfg, engine), say)
            if cfg.artifact_fit_bytes:
                from core.artifact.fit import fit_cap
                from core.train.fitting import fit_on_backend

                fit = fit_on_backend(
                    engine, job.params, cfg, job.dtypes, fit_cap(cfg), code_bytes, hessians, say
                )
                cfg = fit.cfg
                target = out or checkpoint.with_suffix(f".{quant_label(cfg)}.pgolf")
    quantized = fit.model if fit is not None else None
    from core.artifact.upstream import save_upstream_torch

    write = save_upstream_torch if job.upstream else None
    report = export_artifact(job.params, cfg, job.dtypes, target, code_bytes(cfg), hessians, write, quantized)
    extra: dict[str, Any] = {}
    if fit is not None:
        from core.train.fitting import write_fit

        table, fitted = write_fit(fit, target)
        extra = {"fit": str(table), "fit_config": str(fitted)}
    if hessians is not None:
        from core.train.calibration import write_calibration
        from core.train.fitting import fit_shards

        extra["calibration"] = str(write_calibration(target, cfg, fit_shards(cfg) if fit is not None else ()))
    if json_out:
        console.print_json(
            json.dumps(
                {
                    "artifact": str(target),
                    **extra,
                    "sizes": report.sizes,
                    "classes": export_budget(report, cfg, job.params),
                    "gptq_tensors": report.gptq_tensors,
                }
            )
        )
        return
    if fit is not None:
        _print_fit(fit)
        console.print(f"wrote {extra['fit']} and {extra['fit_config']} (export --config or train --config)")
    console.print(f"wrote {target}")
    for key, value in report.sizes.items():
        console.print(f"{key}: {value:,}")
    for line in format_budget(report, cfg, job.params):
        console.print(line)


def _print_fit(fit: Any) -> None:
    """The candidates a fit tried, with the chosen one marked."""
    from rich.table import Table

    table = Table(
        title=f"artifact fit: {fit.cap:,} B cap, calibration loss of the float weights {fit.float_loss:.5f}"
    )
    for column in ("", "kind", "settings", "predicted B", "bytes", "fits", "calibration loss"):
        table.add_column(column, justify="right" if column in ("predicted B", "bytes") else "left")
    for t in fit.trials:
        loss = "-" if t.loss is None else f"{t.loss:.5f}"
        table.add_row("*" if t is fit.chosen else "", t.kind, t.label, f"{t.predicted_bytes:,}", f"{t.bytes:,}",
                      "yes" if t.fits else "no", loss)  # fmt: skip
    console.print(table)
    for note in fit.notes:
        console.print(f"[yellow]{note}[/]")


@app.command()
def package(
    runs: list[Path] = typer.Argument(..., help="Finished run directories of one config, one per seed."),
    name: str = typer.Option(..., help="The record's name, e.g. 'Vocab4096 MLP4x WD0.085'."),
    out: Path | None = typer.Option(
        None, help="Folder to write (default: records/track_<track>/<date>_<name>)."
    ),
    track: str = typer.Option(
        "10min_16mb", help="10min_16mb (the record track: 8xH100, 10 minutes) or non_record_16mb."
    ),
    author: str = typer.Option("", help="Your name, for submission.json."),
    github_id: str = typer.Option("", help="Your GitHub id, for submission.json."),
    blurb: str = typer.Option("", help="One or two sentences on what the record does."),
    compress: bool = typer.Option(
        True,
        "--compress/--plain",
        help="train_gpt.py minified + brotli, 7 bits a character (what counts), or readable.",
    ),
    backend: str = typer.Option(
        "auto", help="Who scores each run's audit: cuda (PyTorch), mlx, or auto (MLX on Apple silicon)."
    ),
) -> None:
    """Write a challenge records folder for finished runs: train_gpt.py, submission.json, README.md,
    requirements.txt, logs. Refused: a seed over the byte cap (each seed's headroom is printed), one whose
    evaluation on 8xH100 took longer than 600 s (10min_16mb), seeds trained on different data. Each run is
    then audited (`audit`): the folder is written only when all pass, its README with a Compliance section
    (the results, and the command that reruns them)."""
    import datetime
    import functools
    import re

    from core.model.backend import create
    from core.runs.audit import audit
    from core.runs.package import write_record

    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "record"
    target = out or Path("records") / f"track_{track}" / f"{datetime.date.today().isoformat()}_{folder}"

    def audited(run: Path):
        console.print(f"auditing {run} ...")
        return audit(run, functools.partial(create, backend), backend)

    path, size = write_record(
        list(runs), target, name, author, github_id, blurb, compress, audited, track, console.print
    )
    console.print(f"wrote {path}")
    console.print(f"train_gpt.py: {size:,} bytes ({'minified + brotli' if compress else 'plain'})")


@app.command("check-record")
def check_record_command(
    folders: list[Path] = typer.Argument(..., help="Records folders: pgolf's (package) or any other's."),
) -> None:
    """Check records folders as a reviewer would: the files the challenge asks for (README.md,
    submission.json, train_gpt.py, a log per seed), each seed's val_bpb, val_loss and size in
    submission.json against its log, every seed under the 16,000,000-byte cap, the seeds distinct,
    the mean right. One line per finding; exit status 1 when any folder has one."""
    from core.runs.record_folder import check_record

    failed = 0
    for folder in folders:
        try:
            findings = check_record(folder) if folder.is_dir() else ["not a folder"]
        except (PgolfError, OSError) as exc:  # an unreadable folder is its finding, the others still checked
            findings = [f"cannot read it ({one_line(exc).removeprefix('error: ')})"]
        failed += bool(findings)
        if not findings:
            console.print(f"{folder}: passes", markup=False)
        for line in findings:
            console.print(f"{folder}: {line}", markup=False)
    if len(folders) > 1:
        console.print(f"{len(folders) - failed} of {len(folders)} folders pass", markup=False)
    if failed:
        raise typer.Exit(1)


@app.command()
@config_flags
def bench(
    backend: str = BACKEND,
    preset: str = PRESET,
    config: Path | None = CONFIG_FILE,
    steps: int = typer.Option(10, min=1, help="Timed optimizer steps."),
    warmup: int = typer.Option(3, min=0, help="Untimed steps first (compilation, caches)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures to this JSON file."),
    overrides: dict | None = None,
) -> None:
    """Time training steps on random tokens: ms/step, tokens/s, peak memory, MFU."""
    import json

    from core.common.files import write_atomic
    from core.config.sources import resolve
    from core.model.memory import check_config
    from core.train.bench import benchmark

    cfg = resolve(preset, config, overrides or {})
    check_config(backend, cfg)
    with opened_backend(backend, cfg) as engine:
        result = benchmark(engine, steps=steps, warmup=warmup)
    if engine.rank != 0:
        return
    for key, value in result.as_dict().items():
        shown = f"{value:,.2f}" if isinstance(value, float) else str(value)
        console.print(f"{key}: {shown}")
    if json_out is not None:
        write_atomic(json_out, (json.dumps(result.as_dict(), indent=2) + "\n").encode())


@app.command()
@config_flags
def plan(
    preset: str = PRESET,
    config: Path | None = CONFIG_FILE,
    hardware: str = typer.Option("8xH100", help="The machine to plan for: 8xH100, 1xH100 or 8xH200."),
    json_out: bool = typer.Option(False, "--json", help="The plan as one JSON object."),
    implementation: str = typer.Option(
        "records",
        help="Whose training code: records (the challenge's records') or pgolf (needs its measured ratio).",
    ),
    calibrate: Path | None = typer.Option(
        None,
        metavar="RECORDS_DIR",
        help="Fit the table on a checkout of the challenge's records, and write it.",
    ),
    backtest: Path | None = typer.Option(
        None,
        metavar="RECORDS_DIR",
        help="Each record predicted by a fit on the others: its line, then the summary.",
    ),
    without: str = typer.Option(
        "",
        help="Plan with the table refitted on its records whose name does not contain this (e.g. 2026-04-27).",
    ),
    table: Path | None = typer.Option(None, help="The fitted table to read or write (default: pgolf's own)."),
    overrides: dict | None = None,
) -> None:
    """What a config costs on the challenge's machines, before renting them: ms a step and tokens/s in each
    training phase, the steps and tokens that fit in the wallclock cap, peak memory a GPU, the artifact's bytes
    with the exact code bytes against the cap, each evaluation phase's seconds, and a verdict. The config is
    given as train takes it (--preset, --config, environment, flags). The factors are fitted on the records'
    logs (--calibrate); each figure carries the band of the leave-one-out backtest (--backtest)."""
    import json

    from core.runs import calibrate as cal
    from core.runs.plan import TABLE_PATH, load_table, make_plan, plan_lines, speed_factor
    from core.runs.record_logs import read_records

    path = table or TABLE_PATH
    if calibrate is not None and backtest is not None:
        raise PgolfError("plan: --calibrate and --backtest each read the records: give one")
    if calibrate is not None or backtest is not None:
        samples, left_out = cal.samples_of(read_records(calibrate or backtest))
        if not samples:
            raise PgolfError(f"plan: no record in {calibrate or backtest} that pgolf can express")
        for item in left_out:
            console.print(f"left out {item['record']}: {item['reason']}", markup=False)
        if backtest is not None:
            lines = cal.backtest(
                samples, cal.synthetic_ratios(), log=lambda line: console.print(line, markup=False)
            )
            console.print(cal.summary_line(lines), markup=False)
            return
        from core.common.files import write_atomic

        fitted = cal.make_table(samples, left_out, f"{len(samples) + len(left_out)} records folders")
        write_atomic(path, (json.dumps(fitted, indent=1) + "\n").encode())
        console.print(f"{cal.summary_line_of(fitted)}; wrote {path}", markup=False)
        return
    cfg = _plan_config(preset, config, overrides or {}, hardware)
    fitted = load_table(path)
    if without:
        fitted = cal.refit_without(fitted, without)
    speed_factor(fitted, implementation)  # refused before the script is packaged for its size
    from core.runs.train_script import code_bytes

    result = make_plan(cfg, hardware, fitted, code_bytes(cfg), implementation)
    if json_out:
        console.print(json.dumps(result.to_json()), markup=False, soft_wrap=True)
        return
    for line in plan_lines(result, fitted):
        console.print(line, markup=False)


def _plan_config(preset: str, config: Path | None, overrides: dict, hardware: str) -> Config:
    """The config `train` would run, checked as `train` checks it (the backend's own checks aside)."""
    from core.config.sources import resolve
    from core.runs.plan import hardware as machine

    cfg = resolve(preset, config, overrides)
    return cfg.validate(machine(hardware).count)


RUNS_DIR = typer.Option(Path(Config().out_dir), "--out-dir", help="Where the run directories are.")


@app.command()
def runs(
    out_dir: Path = RUNS_DIR,
    json_out: bool = typer.Option(False, "--json", help="One JSON object per run instead of the table."),
    compare: list[str] = typer.Option(
        None,
        help="Two groups (train --seeds): is B better than A? Welch's t-test on their val_loss. With --against: "
        "runs (groups, run directories or run names) to test against a record.",
    ),
    more: list[str] = typer.Argument(None, metavar="[RUN]...", help="More of --compare's groups or runs."),
    against: Path | None = typer.Option(
        None,
        help="A records folder: are the --compare runs better than its seeds (its logs, else submission.json)?",
    ),
    margin: float = typer.Option(
        RECORD_MARGIN_NATS, min=0.0, help="With --against: the gain to show, in nats."
    ),
    alpha: float = typer.Option(
        RECORD_P_VALUE, min=0.0, max=1.0, help="With --against: the significance asked."
    ),
    plan: bool = typer.Option(
        False, "--plan", help="Also each run's config planned on 8xH100 (cli.py plan): step time, verdict."
    ),
) -> None:
    """List the runs under --out-dir: model, backend, seed, dataset, the digest of its training shards,
    steps, training and evaluation time, val_bpb, score (or why a run stopped by itself: behind its
    abort_behind reference), size (OVER: past the cap); then each group of seeds with its mean and spread.
    --json: every figure, each evaluation's time and the data's digests. `--compare A B`: is group B better
    than group A? `--compare RUN... --against FOLDER`: are these runs better than a published record?"""
    from dataclasses import asdict

    from rich.measure import Measurement
    from rich.table import Table

    from core.common.files import json_text
    from core.runs.stats import mean_std
    from core.runs.summary import find_runs, run_groups, summarize

    names = [*(compare or []), *(more or [])]
    if more and not compare:
        raise PgolfError(f"runs: {more[0]!r}: give runs or groups after --compare")
    if against is not None:
        if not (math.isfinite(margin) and math.isfinite(alpha)):
            raise PgolfError(f"runs --against: --margin and --alpha must be numbers, got {margin}, {alpha}")
        if not names:
            raise PgolfError("runs --against: give the runs to test with --compare RUN...")
        _compare_against(against, _finished_runs(names, out_dir), margin, alpha, json_out)
        return
    summaries = [summarize(path) for path in find_runs(out_dir)]
    if names:
        if len(names) != 2:
            raise PgolfError(
                f"runs --compare takes two groups (A, then B), got {len(names)}: {', '.join(names)}"
            )
        _compare_groups(run_groups(summaries), *names, json_out=json_out)
        return
    if json_out:
        for s in summaries:
            row = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(s).items()}
            row |= {"plan": _run_plan(s.path)} if plan else {}
            console.print(json_text({**row, "path": str(s.path)}), markup=False, soft_wrap=True)
        return
    table = Table(title=f"runs in {out_dir}")
    columns = ("run", "model", "backend", "seed", "dataset", "data", "steps", "train time", "eval time", "val_bpb",
               "int8 val_bpb", "total bytes")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right" if column in columns[6:] else "left")
    for s in summaries:
        table.add_row(
            s.name,
            s.model,
            s.backend,
            "?" if s.seed is None else str(s.seed),
            s.dataset,
            f"{s.data['train_shards']} shards {s.data['train_shards_sha256'][:8]}" if s.data else "–",
            f"{s.steps:,}",
            f"{s.train_time_ms / 1000:,.1f} s",
            "–" if math.isnan(s.eval_time_s) else f"{s.eval_time_s:,.1f} s",
            "–" if math.isnan(s.val_bpb) else f"{s.val_bpb:.4f}",
            f"{s.roundtrip_val_bpb:.4f}"
            if s.finished
            else f"stopped: {s.stopped}"
            if s.stopped
            else "unfinished",
            "–" if s.total_bytes is None else f"{s.total_bytes:,}" + (" OVER" if s.over_budget else ""),
        )
    tables = [table]
    groups = run_groups(summaries)
    if groups:
        by_group = Table(title="groups (finished runs; the score is sliding-window where evaluated so)")
        for column in ("group", "runs", "seeds", "mean val_loss", "mean val_bpb", "std val_bpb"):
            by_group.add_column(column, justify="left" if column in ("group", "seeds") else "right")
        for name, members in groups.items():
            mean, std = mean_std([m.score_val_bpb for m in members])
            by_group.add_row(
                name, str(len(members)), ",".join(str(m.seed) for m in members),
                f"{mean_std([m.score_val_loss for m in members])[0]:.5f}", f"{mean:.5f}",
                "–" if math.isnan(std) else f"{std:.5f}",
            )  # fmt: skip
        tables.append(by_group)
    for t in tables:
        if console.is_terminal:
            console.print(t)
            continue
        # Piped, a table keeps its natural width rather than wrapping its cells at 80 columns.
        width = Measurement.get(console, console.options.update_width(1000), t).maximum
        Console(highlight=False, width=width).print(t)
    for s in summaries if plan else ():
        short = _run_plan(s.path)
        pace = "/".join(f"{ms:,.1f}" for ms in short["ms_per_step"])
        console.print(f"{s.name}: plan on {short['hardware']}{f' at {pace} ms/step' if pace else ''}: "
                      f"{short['verdict']}", markup=False)  # fmt: skip


def _run_plan(path: Path) -> dict:
    """A run's config (its config.json) planned on 8xH100, short (core.runs.plan.target_summary)."""
    from core.config.sources import read_run_config
    from core.runs.plan import target_summary

    return target_summary(Config.from_dict(read_run_config(path / "config.json")))


def _finished_runs(names: list[str], out_dir: Path) -> list:
    """The finished runs these names give: each a run group under out_dir, a run directory, or a run's name."""
    from core.runs.summary import find_runs, run_groups, summarize

    groups = run_groups([summarize(p) for p in find_runs(out_dir)]) if out_dir.is_dir() else {}
    found = []
    for name in names:
        if name in groups:
            found += groups[name]
            continue
        path = next((p for p in (Path(name), out_dir / name) if (p / "metrics.jsonl").is_file()), None)
        if path is None:
            raise PgolfError(f"{name}: no run group under {out_dir} and no run directory")
        run = summarize(path)
        if not run.finished:
            raise PgolfError(f"{path}: the run has not finished (no final score)")
        found.append(run)
    for run in found:
        if not (math.isfinite(run.score_val_loss) and math.isfinite(run.score_val_bpb)):
            raise PgolfError(
                f"{run.path}: its final val_loss {run.score_val_loss} and val_bpb {run.score_val_bpb} are not both "
                "finite: a diverged run has no score to compare"
            )
    return list({run.path.resolve(): run for run in found}.values())


def _compare_against(folder: Path, found: list, margin: float, alpha: float, json_out: bool) -> None:
    """Welch's one-sided t-test that the runs' val_loss is below the record's seeds' by more than `margin`
    nats (the challenge's rule), and the same in val_bpb with the margin converted at the record's ratio."""
    from dataclasses import asdict

    from core.common.files import json_text
    from core.runs.record_folder import seed_figures
    from core.runs.stats import mean_std, welch

    seeds, record_loss, record_bpb = seed_figures(folder)
    loss, bpb = [r.score_val_loss for r in found], [r.score_val_bpb for r in found]
    # bpb / nats is the record's tokens per byte over ln 2: the same margin, measured in val_bpb.
    margin_bpb = margin * mean_std(record_bpb)[0] / mean_std(record_loss)[0]
    nats, bits = welch(record_loss, loss, margin), welch(record_bpb, bpb, margin_bpb)
    run_seeds = ",".join("?" if r.seed is None else str(r.seed) for r in found)
    if json_out:
        result = {"record": str(folder), "record_seeds": seeds, "runs": [str(r.path) for r in found],
                  "run_seeds": [r.seed for r in found], "margin_nats": margin, "margin_bpb": margin_bpb,
                  "alpha": alpha, "nats": asdict(nats), "bpb": asdict(bits), "beats_record": nats.p < alpha}  # fmt: skip
        console.print(json_text(result), markup=False, soft_wrap=True)
        return
    console.print(
        f"record {folder}: seeds {','.join(seeds)}; mean val_loss {nats.mean_a:.6f} (std {nats.std_a:.6f}), "
        f"val_bpb {bits.mean_a:.6f} (std {bits.std_a:.6f})", markup=False,
    )  # fmt: skip
    console.print(
        f"runs: {len(found)} (seeds {run_seeds}); mean val_loss {nats.mean_b:.6f} (std {nats.std_b:.6f}), "
        f"val_bpb {bits.mean_b:.6f} (std {bits.std_b:.6f})", markup=False,
    )  # fmt: skip
    console.print(
        f"record - runs: {nats.diff:.6f} nats, {bits.diff:.6f} val_bpb (positive: the runs are better)"
    )
    console.print(
        f"Welch t={nats.t:.4f} df={nats.df:.2f}: p={nats.p:.3e} that the runs are not better by {margin:g} nats; "
        f"in val_bpb (margin {margin_bpb:.5f}): p={bits.p:.3e}"
    )
    verdict = "[bold green]beats the record[/]" if nats.p < alpha else "[yellow]does not beat the record[/]"
    console.print(f"{verdict} by {margin:g} nats at p < {alpha:g}")


def _compare_groups(groups: dict, a: str, b: str, json_out: bool = False) -> None:
    """Welch's one-sided t-test that group B's val_loss is below group A's (core/runs/stats.py)."""
    from dataclasses import asdict

    from core.common.files import json_text
    from core.runs.stats import RECORD_MARGIN_NATS, RECORD_P_VALUE, mean_std, welch

    for name in (a, b):
        if name not in groups:
            raise PgolfError(f"no finished runs in group {name!r} (groups: {', '.join(groups) or 'none'})")
    loss = {g: [m.score_val_loss for m in groups[g]] for g in (a, b)}
    bpb = {g: [m.score_val_bpb for m in groups[g]] for g in (a, b)}
    gain = welch(loss[a], loss[b])
    bar = welch(loss[a], loss[b], RECORD_MARGIN_NATS)
    diff_bpb = mean_std(bpb[a])[0] - mean_std(bpb[b])[0]
    if json_out:
        result = {"a": a, "b": b, "diff_nats": gain.diff, "diff_bpb": diff_bpb, "gain": asdict(gain),
                  "record_bar": asdict(bar), "meets_record_bar": bar.p < RECORD_P_VALUE}  # fmt: skip
        console.print(json_text(result), markup=False, soft_wrap=True)
        return
    console.print(f"A = {a}: {len(loss[a])} runs, mean val_loss {gain.mean_a:.6f} (std {gain.std_a:.6f})")
    console.print(f"B = {b}: {len(loss[b])} runs, mean val_loss {gain.mean_b:.6f} (std {gain.std_b:.6f})")
    console.print(f"A - B: {gain.diff:.6f} nats, {diff_bpb:.6f} val_bpb (positive: B is better)")
    console.print(f"Welch t={gain.t:.4f} df={gain.df:.2f}: p={gain.p:.3e} that B is no better than A")
    console.print(
        f"p={bar.p:.3e} that B is not better by {RECORD_MARGIN_NATS} nats: "
        + (
            f"[bold green]meets the challenge's bar[/] (p < {RECORD_P_VALUE})"
            if bar.p < RECORD_P_VALUE
            else f"[yellow]does not meet the challenge's bar[/] ({RECORD_MARGIN_NATS} nats at p < {RECORD_P_VALUE})"
        )
    )


@app.command()
def plot(
    run_dirs: list[Path] = typer.Argument(None, help="Run directories (default: every run in --out-dir)."),
    out: Path = typer.Option(Path("curves.png"), help="File to write: .png, .svg or .pdf."),
    x: str = typer.Option("step", help="x axis: step or time (training minutes)."),
    out_dir: Path = RUNS_DIR,
) -> None:
    """Plot validation BPB and (smoothed) training loss of runs side by side: PNG, SVG or PDF."""
    from core.runs.plots import plot_runs
    from core.runs.summary import find_runs

    chosen = list(run_dirs or find_runs(out_dir))
    for path in chosen:
        if not (path / "metrics.jsonl").is_file():
            raise PgolfError(f"{path}: not a run directory (no metrics.jsonl)")
    if not chosen:
        raise PgolfError(f"no runs to plot in {out_dir}")
    console.print(f"wrote {plot_runs(chosen, out, x)} ({len(chosen)} runs)")


@app.command()
def sweep(
    spec: Path = typer.Argument(
        ...,
        help="Sweep spec (TOML): a base preset or config, a grid or variants, seeds, backend (docs/sweeps.md).",
    ),
    report: bool = typer.Option(False, "--report", help="Only write the report of the runs finished so far."),
    parallel: int | None = typer.Option(
        None, min=1, help="Runs at once, each its own process (default: the spec's)."
    ),
    retry_failed: bool = typer.Option(
        False, help="Start again the runs that failed (else they are reported)."
    ),
) -> None:
    """Train every (variant, seed) of a sweep as an ordinary run, then rank the variants: mean ± std of the
    final val_bpb, the difference from the base, Welch's p that each is better. Finished runs are skipped
    and interrupted ones resumed, so a sweep stopped with Ctrl-C goes on where it was. The report is
    written beside the spec: <spec>.report.md, .json and .png."""
    from core.common.files import WriterLock
    from core.runs.sweep import load_sweep, markdown, write_report

    plan = load_sweep(spec)
    if not report:
        with WriterLock(spec, "sweep spec"):  # one sweep of a spec at a time
            _run_sweep(plan, parallel or plan.parallel, retry_failed)
    result, paths, no_plot = write_report(plan, f"python cli.py sweep {spec}")
    console.print(markdown(result), markup=False)
    console.print(f"wrote {', '.join(map(str, paths))}")
    if no_plot:
        err_console.print(f"warning: {no_plot}", markup=False)


def _run_sweep(plan: Any, parallel: int, retry_failed: bool) -> None:
    """Start the runs of `plan` not yet done, `parallel` at a time, each `cli.py train` in a process of its
    own (its output in its folder's sweep.log), with the progress; stopped, they write a checkpoint."""
    import json
    import shutil
    import subprocess

    from core.common.files import write_atomic
    from core.model.memory import check_config
    from core.runs import sweep as sw
    from core.runs.summary import summarize
    from core.train.managed import BehindReference

    states = {run.run_id: sw.run_state(run) for run in plan.runs}
    todo = [run for run in plan.runs
            if states[run.run_id] in (sw.NEW, sw.RESUME) or (retry_failed and states[run.run_id] == sw.FAILED)]  # fmt: skip
    for run in todo:  # every run refused before the first one starts
        check_config(plan.backend, run.cfg)
    counts = {
        state: list(states.values()).count(state) for state in (sw.DONE, sw.BEHIND, sw.FAILED, sw.RESUME)
    }
    console.print(
        f"sweep {plan.name}: {len(plan.runs)} runs ({len(plan.variants)} variants x {len(plan.seeds)} seeds): "
        f"{counts[sw.DONE]} done, "
        + (f"{counts[sw.BEHIND]} stopped behind their reference, " if counts[sw.BEHIND] else "")
        + f"{counts[sw.FAILED]} failed before{' (started again)' if retry_failed else ''}, "
        f"{counts[sw.RESUME]} to resume; {len(todo)} to run"
        + (f", {min(parallel, len(todo))} at a time" if todo else "")
    )
    for data_path in dict.fromkeys(run.cfg.data_path for run in todo):
        _ensure_default_data(next(run.cfg for run in todo if run.cfg.data_path == data_path))
    env = sw.child_environ(dict(os.environ))  # each run's config is its sweep_config.json, whole
    if parallel > 1 and "OMP_NUM_THREADS" not in env:  # the processes share the cores, not each take all
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // parallel))
    script = str(Path(__file__).resolve())

    def start(run: Any) -> tuple[Any, Any]:
        path, state = run.path, states[run.run_id]
        if state == sw.RESUME:
            args = ["--resume", str(path)]
        else:  # afresh: run_state checked that the folder, if any, is this sweep's and not in use
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
            write_atomic(path / sw.CONFIG_FILE, (json.dumps(run.cfg.to_dict(), indent=2) + "\n").encode())
            args = ["--preset", plan.preset, "--config", str(path / sw.CONFIG_FILE)]
        log = open(path / sw.LOG_FILE, "a", encoding="utf-8")  # noqa: SIM115 (closed when the run ends)
        command = [sys.executable, script, "train", "--backend", plan.backend, *args]
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        # A session of its own: Ctrl-C reaches the sweep, which stops each run once (see stop_all).
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip
        return proc, log

    def stop_all(running: dict) -> None:
        """SIGTERM each run: it writes a checkpoint after its current step; a second Ctrl-C kills them."""
        if not running:
            return
        err_console.print(f"stopping {len(running)} runs, each with a checkpoint (again: stop them now)")
        for _, proc, _, _ in running.values():
            proc.terminate()
        try:
            for _, proc, _, _ in running.values():
                proc.wait()
        except BaseException:
            for _, proc, _, _ in running.values():
                proc.kill()
            raise
        finally:
            for _, _, log, _ in running.values():
                log.close()

    pending, running, ended, began = list(todo), {}, 0, time.monotonic()
    live = LiveProgress()
    overall = live.tracker("sweep")
    with live:
        if overall is not None and todo:
            overall(0, len(todo))
        try:
            while pending or running:
                while pending and len(running) < parallel:
                    run = pending.pop(0)
                    proc, log = start(run)
                    running[run.run_id] = (run, proc, log, time.monotonic())
                    how = "resumed" if states[run.run_id] == sw.RESUME else "started"
                    console.print(f"{how} {run.run_id} (log: {run.path / sw.LOG_FILE})", markup=False)
                time.sleep(0.5)
                for run_id, (run, proc, log, t0) in list(running.items()):
                    bar = live.tracker(run_id)
                    if bar is not None:
                        bar(min(sw.run_step(run.path), run.cfg.iterations - 1), run.cfg.iterations)
                    if proc.poll() is None:
                        continue
                    log.close()
                    del running[run_id]
                    if bar is not None:
                        bar(run.cfg.iterations, run.cfg.iterations)
                    ended += 1
                    took = time.monotonic() - t0
                    if proc.returncode in (0, OverBudget.status) and summarize(run.path).finished:
                        s = summarize(run.path)  # (a run over the byte cap is scored all the same)
                        over = " (over the byte cap)" if proc.returncode == OverBudget.status else ""
                        line = f"done {run_id}: val_bpb {s.score_val_bpb:.4f}{over} in {took / 60:.1f} min"
                    elif proc.returncode == BehindReference.status and summarize(run.path).stopped:
                        s = summarize(run.path)
                        line = f"behind {run_id}: stopped at step {s.steps}, {s.stopped} (not a failure)"
                    elif proc.returncode in (130, 143):
                        line = f"stopped {run_id} (exit {proc.returncode}): run the sweep again to resume it"
                    else:
                        error = sw.last_error_line(run.path / sw.LOG_FILE)
                        write_atomic(run.path / sw.FAILED_FILE, (error + "\n").encode())
                        line = f"failed {run_id}: {error}"
                    left = len(pending) + len(running)
                    eta = (time.monotonic() - began) / ended * left / 60
                    console.print(
                        f"{line} ({ended}/{len(todo)} ended; about {eta:.0f} min left)", markup=False
                    )
                    if overall is not None:
                        overall(ended, len(todo))
        except BaseException:
            stop_all(running)
            raise


@app.command()
def info() -> None:
    """What is installed: Python, backends, devices, and the default dataset."""
    import numpy

    console.print(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    console.print(f"numpy {numpy.__version__}")
    from core.model.backend import BACKENDS, pick
    from core.runs.setup import DEFAULT_DATA

    devices = {}
    for info_ in BACKENDS.values():
        if not info_.installed:
            console.print(f"{info_.title}: not installed (pip install 'pgolf[{info_.framework}]')")
            continue
        if info_.framework == "torch":
            import torch

            version = torch.__version__
            devices[info_.name] = (
                ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
                if torch.cuda.is_available()
                else "the CPU (no CUDA device)"
            )
        else:
            import mlx.core as mx

            version = mx.__version__
            devices[info_.name] = "the GPU" if mx.default_device() == mx.gpu else "the CPU"
        console.print(f"{info_.title} {version} (--backend {info_.name}): runs on {devices[info_.name]}")
    try:
        chosen = pick("auto")
        console.print(f"auto backend: {chosen.title} on {devices[chosen.name]} (--backend {chosen.name})")
    except PgolfError:
        console.print("auto backend: none installed")
    data = Path(DEFAULT_DATA)
    console.print(f"default dataset: {data} ({'present' if data.exists() else 'not prepared yet'})")


class Terminated(Exception):
    """SIGTERM arrived: unwind like Ctrl-C, so that no temp file or half-written output is left."""


class Signals:
    """Ctrl-C and SIGTERM while a command runs: raised at once (KeyboardInterrupt, Terminated), except
    while `held`, when the first one is kept for the training loop to act on between steps (it writes
    a checkpoint, then raises it); a second one is raised at once, and so is every one after the loop
    has `release`d them (its last checkpoint written, for the final export and scores)."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: BaseException | None = None
        self.note = ""  # said when a signal arrives after `release`

    def handle(self, signum, frame) -> None:
        exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated()
        if self.holding and self.pending is None:
            self.pending = exc
            os.write(2, f"\n{HOLDING_NOTICE}\n".encode())  # at once: a validation pass can take a while
            return
        if self.note:
            os.write(2, f"\n{self.note}\n".encode())
            self.note = ""
        raise exc

    def __call__(self) -> BaseException | None:
        """The poll the training loop calls between steps: the signal held, if one came."""
        return self.pending

    def release(self, note: str = "") -> None:
        """From now on a signal is raised at once, after `note` on stderr (the training loop calls this once
        its last checkpoint is on disk: nothing is left to save; the note says where it is); one held
        until now is raised here."""
        self.holding, self.note = False, note
        if self.pending is not None:
            raise self.pending

    @contextlib.contextmanager
    def held(self):
        self.holding, self.pending = True, None
        try:
            yield self
        finally:
            self.holding, self.note = False, ""


HOLDING_NOTICE = "stopping after the current step, with a checkpoint (again: stop now, without one)"
SIGNALS = Signals()


def _end_soon_after_sigterm(grace_s: float = 5.0) -> None:
    """End the process `grace_s` after a SIGTERM, if the main thread has not ended it by then.

    Python runs signal handlers on the main thread between bytecodes, which a rank waiting in a
    collective for a rank that is gone (or in a device sync) never reaches; torchrun would wait
    30 s before its SIGKILL. The wakeup fd hears the signal at once, on this thread.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while os.read(read_fd, 1) != bytes([signal.SIGTERM]):
            pass
        time.sleep(grace_s)
        os._exit(143)

    threading.Thread(target=watch, name="sigterm-grace", daemon=True).start()


def _ending(exc: BaseException) -> tuple[int, str | None]:
    """The exit status and the one line an exception ends a command with; None: a bug, show its traceback."""
    if isinstance(exc, PgolfError | OSError):
        return getattr(exc, "status", 1), one_line(exc)
    if isinstance(exc, (KeyboardInterrupt, typer.Abort)):
        return 130, "interrupted"
    if isinstance(exc, Terminated):
        return 143, "terminated"
    if out_of_memory(exc):  # where no nearer step named its settings (core.common.errors.memory_hint)
        return 1, f"error: out of memory ({first_line(exc)}): lower the batch or model settings"
    return 1, None


def _stdout_gone() -> bool:
    """Whether stdout's reader went away (`train | head`): rich and typer then end with exit code 1,
    rich having pointed stdout at /dev/null, typer having wrapped it to silence its flushes."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    try:
        return os.path.samestat(os.fstat(1), os.stat(os.devnull))
    except OSError:
        return False


def main() -> NoReturn:
    """Run the command; its process ends without tearing its modules down (`exit_now`). A bug's exception
    goes on up, to its traceback."""
    try:
        _run_command()
    except SystemExit as exc:
        exit_now(exc.code)


def exit_now(code: int | str | None) -> NoReturn:
    """End the process as the interpreter would, less the teardown of every imported module, which after
    PyTorch's compiler was imported is 1-2 s of CPU (docs/performance.md): wait for non-daemon threads,
    run the exit handlers, flush the standard streams, exit with `code` (a text: printed, status 1)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or closed: nothing to write to
            stream.flush()
    os._exit(code or 0)


def _run_command() -> NoReturn:
    _catch_signals(SIGNALS.handle)
    piped_to_null = _stdout_gone()  # `> /dev/null` from the start is no broken pipe
    try:
        world_size = launch().world_size  # torchrun's settings, checked before any command (--help too)
    except PgolfError as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise SystemExit(1) from None
    if world_size > 1:  # a rank under torchrun
        _end_soon_after_sigterm()
    try:
        code = app(standalone_mode=False)
    except NO_ARGS_IS_HELP as exc:
        # typer's rich help is already printed by the time this is raised; click's plain one is not
        if exc.format_message():
            console.print(exc.format_message(), markup=False)
        code = 0
    except SystemExit as exc:
        if exc.code != 1 or piped_to_null or not _stdout_gone():
            raise
        raise SystemExit(EXIT_BROKEN_PIPE) from None
    except click_errors.UsageError as exc:  # a bad flag or argument
        command = exc.ctx.command_path if exc.ctx else "cli.py"
        err_console.print(f"error: {exc.format_message()} (see {command} --help)", markup=False)
        raise SystemExit(2) from None
    except (
        PgolfError,
        OSError,
        KeyboardInterrupt,
        typer.Abort,
        Terminated,
        MemoryError,
        RuntimeError,
    ) as exc:
        code, line = _ending(exc)
        if line is None:  # a bug: its traceback
            raise
        err_console.print(line, markup=False)
        raise SystemExit(code) from None
    if code == 130:  # typer turns Ctrl-C into exit code 130
        err_console.print("interrupted", markup=False)
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
