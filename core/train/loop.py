"""The training driver, written once for both backends.

When to validate, stop, checkpoint, log and export; the training clock and the
schedules; the data stream and the validation metric. A backend (see
`core.model.backend`) only takes steps and evaluates token spans, and holds the run's
one config (`backend.cfg`).

The timeline follows the challenge's reference script, one named step each in
`Training`: `start` (everything that can be refused, the initial weights included: seeded, or
pgolf's `train`'s `init_from` with a fresh optimizer at step 0; then the run directory),
`warm_up` (compile-warmup steps, then undone; not when resuming), the loop of `train_step`s with
`validate` at step 0, every `val_loss_every` steps and at the end, and
`save_checkpoint` after the last step (the weights checked; pgolf's `train` writes them there, and
periodically: core/train/managed.py; a packaged run writes no checkpoint); validation and
checkpoints are off the training clock (`Clock.paused`). A wallclock cap stops all ranks at the same step. Depth
recurrence switches on at the top of the first `train_step` past
`enable_looping_at` (`core.model.schedule.looping_active`, recomputed on resume).
Then `export_and_score`: the moving average of the weights replaces them when
`ema_decay` > 0, GPTQ's Hessians are collected when `gptq_enabled` (the time for it
was taken off the cap: `Config.train_cap_seconds`), the artifact is written
(core/artifact/export.py), read back from disk and scored again, looped when
`num_loops` > 0: over non-overlapping sequences, and with sliding windows when
`eval_stride` is set (both figures are logged, as the records do), each evaluation timed (a warning
past `max_eval_seconds`). A run whose artifact + code pass `budget_bytes` ends with `check_budget`'s
error (exit status 3) once its backend is closed.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.artifact.export import ExportReport, dequantize, export_artifact, quant_label, read_pgolf_artifact
from core.common.compress import check_available
from core.common.errors import OverBudget, PgolfError, memory_hint, setting
from core.common.files import file_sha256
from core.config.features import uses_coprime_loader, uses_gptq
from core.config.fields import Config
from core.data.coprime import CoprimeLoader
from core.data.sequential import BatchLoader
from core.data.shards import find_shards
from core.eval.bpb import BPBMeter
from core.eval.score import evaluators, figure_protocol, load_eval_data
from core.model.params import count_params, flops_per_token, init_params, storage_dtypes
from core.model.schedule import looping_active, lr_multiplier, muon_momentum, muon_wd_multiplier
from core.train.calibration import calibrate_gptq, write_calibration
from core.train.rundir import RunDir, config_digest

if TYPE_CHECKING:  # only annotations name these
    from core.artifact.mixed import MixedModel
    from core.model.backend import Backend

    Log = Callable[[str], None]

# The longest the other ranks wait in `backend.from_rank_0` for rank 0's work alone (the fit, the export).
RANK_0_WAIT_SECONDS = 6 * 3600.0

# A run has diverged, and stops with an error, when a logged training loss or a validation loss is
# not finite, when one is above ln(vocab_size) (the loss of predicting every token as equally likely,
# where a fresh model starts, and where its first steps may climb a little) at a step past
# DIVERGENCE_AFTER_STEPS, or when the RMS of all weights passes WEIGHT_RMS_LIMIT (fresh weights are
# ~0.03, trained ones stay well below 1; beyond the limit float16, the artifact's format, is a few
# steps from overflowing). Nothing
# non-finite is written: the check runs before each metric record, each checkpoint and the export, and a
# checkpoint whose weights break the rule is refused when a run resumes from it.
DIVERGENCE_AFTER_STEPS = 20
WEIGHT_RMS_LIMIT = 1e3


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    train_time_ms: float
    val_loss: float  # the exported weights before quantization
    val_bpb: float
    roundtrip_val_loss: float  # after the artifact round trip, non-overlapping sequences
    roundtrip_val_bpb: float
    artifact_bytes: int
    code_bytes: int
    peak_memory_bytes: int | None
    sliding_val_loss: float | None = None  # after the round trip, sliding windows (eval_stride)
    sliding_val_bpb: float | None = None
    ttt_val_loss: float | None = None  # after the round trip, with test-time training (ttt_enabled)
    ttt_val_bpb: float | None = None
    roundtrip_eval_s: float | None = None  # each evaluation's wall time, in seconds
    sliding_eval_s: float | None = None
    ttt_eval_s: float | None = None
    eval_time_s: float = 0.0  # all of them, and reading and decompressing the artifact before
    artifact_sha256: str = ""  # of the artifact file written (rank 0's): `package` checks the file against it


# The RunResult figures of each evaluator (core.eval.score): <its name here>_val_loss and _val_bpb.
RESULT_FIGURES = {"plain": "roundtrip", "sliding_window": "sliding", "ttt": "ttt"}


def make_train_loader(
    cfg: Config, files: list[Path], rank: int = 0, world_size: int = 1
) -> BatchLoader | CoprimeLoader:
    """The training loader `cfg.train_loader` names (core.data.shards.TRAIN_LOADERS) over `files`."""
    loader = CoprimeLoader if uses_coprime_loader(cfg) else BatchLoader
    return loader(files, rank, world_size, cfg.vocab_size)


def train_loader(cfg: Config, backend: Backend) -> BatchLoader | CoprimeLoader:
    """This rank's training data from its start."""
    files = find_shards(cfg.data_path, "train")
    return make_train_loader(cfg, files, backend.rank, backend.world_size)


def _shared_run_id(cfg: Config, backend: Backend) -> str:
    """A fresh timestamp name unless one is given; every rank takes rank 0's choice."""
    if cfg.run_id:
        return cfg.run_id

    def name(now: float, n: int) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        return stamp if n == 0 else f"{stamp}-{n}"

    choice = np.zeros(2)
    if backend.rank == 0:  # runs started within the same second get -1, -2, ...
        now, n = time.time(), 0
        while (Path(cfg.out_dir) / name(now, n)).exists():
            n += 1
        choice[:] = now, n
    now, n = backend.all_reduce_sum(choice)
    return name(now, int(n))


class Clock:
    """Training time in ms: it runs while training, stops for validation and checkpoints,
    and starts from the time a resumed run had already trained."""

    def __init__(self, backend: Backend, start_ms: float = 0.0):
        self.backend, self.banked_ms = backend, start_ms
        self.started: float | None = None

    def start(self) -> None:
        self.backend.synchronize()
        self.started = time.perf_counter()

    def stop(self) -> None:
        self.backend.synchronize()
        self.banked_ms, self.started = self.ms(), None

    def ms(self) -> float:
        running = 0.0 if self.started is None else 1000.0 * (time.perf_counter() - self.started)
        return self.banked_ms + running

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        running = self.started is not None
        self.stop()
        yield
        if running:
            self.start()


class Training:
    """One training run, as the named steps the module docstring lists; `run` strings them together.
    A packaged train_gpt.py runs this; pgolf's `train` runs `ManagedTraining`
    (core/train/managed.py), which adds checkpoints, resuming, `init_from`, the artifact fit, trackers,
    stopping on a signal, progress displays, notes and the data's digests by overriding `start`,
    `load_weights`, `open_run_dir`,
    `warm_up`, `train_step`, `agreed_ms`, `save_checkpoint`, `artifact_settings` and `_log_header`, and
    the hooks that do nothing here: `write_checkpoint`, `after_step`, `trained`, `stop_if_asked`,
    `watch`."""

    def __init__(self, backend: Backend, log: Log = print, code_bytes: int = 0):
        self.backend, self.cfg, self.log = backend, backend.cfg, log
        self.code_bytes = code_bytes  # the run's code bytes (a packaged run knows its own size)
        self.main = backend.rank == 0
        self.accum = self.cfg.local_accum_steps(backend.world_size)
        self.dtypes = storage_dtypes(self.cfg, backend.bf16)
        self.step = 0
        self.looping = False  # the layer layout the backend runs (depth recurrence)
        self.stop_after: int | None = None
        self.val_loss = self.val_bpb = math.nan
        self.run_dir: RunDir | None = None  # the run directory, once `start` has made it

    # ------------------------------------------------------------------ steps
    def start(self) -> None:
        """Check and load everything that can be refused, then create the run directory."""
        cfg, backend = self.cfg, self.backend
        cfg.validate(backend.world_size)
        check_available(cfg.compressor)  # refused now, not when the artifact is written
        self.data = load_eval_data(cfg)
        self.loader = train_loader(cfg, backend)
        start_ms = self.load_weights()
        # Derived from the step and the clock, so a resumed run needs nothing saved for it.
        self.looping = looping_active(cfg, self.step, start_ms)
        backend.set_looping(self.looping)
        self.clock = Clock(backend, start_ms)
        self.run_dir = self.open_run_dir(_shared_run_id(cfg, backend))
        self.run_dir.write_config(cfg.to_dict())
        self.metric(kind="start", step=self.step, backend=backend.name, device=backend.device,
                    world_size=backend.world_size, config_sha256=config_digest(cfg.to_dict()))  # fmt: skip
        self._log_header()
        self.say(f"run_dir:{self.run_dir.path}")

    def load_weights(self) -> float:
        """The initial weights, seeded (ManagedTraining's: `init_from`'s, or a checkpoint's); returns
        the training clock the run starts from."""
        self.backend.load_params(init_params(self.cfg, bf16=self.backend.bf16))
        return 0.0

    def open_run_dir(self, run_id: str) -> RunDir:
        return RunDir(self.cfg.out_dir, run_id, enabled=self.main)

    def warm_up(self) -> None:
        """Prime the compiled paths with real steps (once more looped, with depth recurrence, so the
        switch compiles nothing inside the timed run), then restore the true initial state and start
        the data again (a fresh run's: a new loader)."""
        backend, cfg = self.backend, self.cfg
        params0, opt0 = backend.params(), backend.optimizer_state()
        for looping in (False, True) if cfg.num_loops > 0 else (False,):
            backend.set_looping(looping)
            name = "loop_warmup_step" if looping else "warmup_step"
            for i in range(cfg.warmup_steps):
                backend.train_step(self._micro_batches(), lr_multiplier(cfg, 0, 0.0), muon_momentum(cfg, 0))
                if cfg.warmup_steps <= 20 or (i + 1) % 10 == 0 or i + 1 == cfg.warmup_steps:
                    self.say(f"{name}:{i + 1}/{cfg.warmup_steps}")
        backend.set_looping(self.looping)
        backend.load_params(params0)
        backend.load_optimizer_state(opt0)
        self.loader = train_loader(cfg, backend)

    def validate(self) -> None:
        with self.clock.paused():
            meter = self._score_plain()
            uniform = math.log(self.cfg.vocab_size)
            late = self.step >= DIVERGENCE_AFTER_STEPS
            if not math.isfinite(meter.val_loss) or (late and meter.val_loss > uniform):
                raise PgolfError(
                    f"training diverged: val_loss {meter.val_loss:.4f} at step {self.step} (the loss of "
                    f"predicting every token as equally likely is {uniform:.4f}); lower the learning "
                    f"rates (the log is in {self.run_dir.path})"
                )
            ms = self.clock.ms()
            self.say(
                f"step:{self.step}/{self.cfg.iterations} val_loss:{self.val_loss:.4f} val_bpb:{self.val_bpb:.4f} "
                f"train_time:{ms:.0f}ms step_avg:{ms / max(self.step, 1):.2f}ms"
            )
            self.metric(
                kind="val", step=self.step, val_loss=self.val_loss, val_bpb=self.val_bpb, train_time_ms=ms
            )

    def train_step(self) -> None:
        """One optimizer step at the scheduled lr, momentum and layer layout, then its log line when due."""
        cfg = self.cfg
        self.set_looping(looping_active(cfg, self.step, self.elapsed_ms))
        lr_mult = lr_multiplier(cfg, self.step, self.elapsed_ms)
        momentum = muon_momentum(cfg, self.step)
        wd_mult = muon_wd_multiplier(cfg, self.step, self.elapsed_ms)
        with memory_hint("a training step", "--train-batch-tokens, or raise --grad-accum-steps"):
            loss = self.backend.train_step(self._micro_batches(), lr_mult, momentum, wd_mult)
        self.step += 1
        self.elapsed_ms = self.agreed_ms()
        self.after_step()
        due = self.step <= 10 or self.step % max(cfg.train_log_every, 1) == 0 or self.stop_after is not None
        if cfg.train_log_every > 0 and due:
            self._log_train(loss, lr_mult, momentum)

    def save_checkpoint(self) -> None:
        """After the last step (and for each of ManagedTraining's checkpoints): rank 0 stops a run whose
        weights have diverged (see WEIGHT_RMS_LIMIT), else hands them to `write_checkpoint`; every rank's
        clock stops until it is done."""
        with self.clock.paused():
            if self.main:
                params = self.backend.params()
                rms = weights_rms(params)
                if not rms <= WEIGHT_RMS_LIMIT:
                    raise PgolfError(
                        f"training diverged: the weights' RMS is {rms:.3g} at step {self.step} (the limit "
                        f"is {WEIGHT_RMS_LIMIT:g}); no checkpoint written; lower the learning rates"
                    )
                self.write_checkpoint(params)
            self.backend.all_reduce_sum(np.zeros(1))  # the barrier that keeps the clocks alike

    def write_checkpoint(self, params: dict[str, np.ndarray]) -> None:
        """A packaged run writes no checkpoint: only pgolf's `train` resumes, and writes them."""

    def stop_if_asked(self) -> None:
        """Polled between steps, between validation batches and between the steps of the final export:
        where a stop asked for ends the run."""

    def watch(self, done: int, total: int) -> None:
        """Called by a long pass (validation) after each batch of its `total`."""

    def export_and_score(self) -> RunResult:
        """Write the artifact of the final (or averaged) weights and score what was written."""
        backend, cfg = self.backend, self.cfg
        self.set_looping(cfg.num_loops > 0)  # a model trained with depth recurrence is scored looped
        if cfg.ema_decay > 0:
            state = backend.optimizer_state()
            backend.load_params({name: state[f"ema/{name}"] for name in backend.params()})
            self._score_plain()
            self.say(
                f"ema val_loss:{self.val_loss:.4f} val_bpb:{self.val_bpb:.4f} (exported: the moving average)"
            )
        self.stop_if_asked()
        hessians = None
        if uses_gptq(cfg) or cfg.artifact_fit_bytes > 0:
            hessians = calibrate_gptq(backend, train_loader(cfg, backend), self.say)
            self.stop_if_asked()
        params = backend.params()
        cfg, quantized, fit_shards = self.artifact_settings(params, hessians)
        label = quant_label(cfg)
        artifact = self.run_dir.artifact(label)
        sizes: dict[str, int] = {}
        if self.main:
            report = export_artifact(
                params, cfg, self.dtypes, artifact, self.code_bytes, hessians, quantized=quantized
            )
            if hessians is not None:
                write_calibration(artifact, cfg, fit_shards)
            sizes = report.sizes
            fits = "fits" if sizes["total_bytes"] <= sizes["budget_bytes"] else "OVER BUDGET"
            kind = f"{label}+{cfg.compressor}"
            self.say(f"Serialized model {kind}: {sizes['model_bytes']} bytes")
            self.say(f"Code size: {sizes['code_bytes']} bytes")
            self.say(f"Total submission size {kind}: {sizes['total_bytes']} bytes ({fits})")
            self.say(
                f"artifact:{artifact} format:{cfg.quant_format} payload:{sizes['payload_bytes']} "
                f"budget:{sizes['budget_bytes']} headroom:{sizes['headroom_bytes']}"
                + (f" gptq_tensors:{report.gptq_tensors}" if cfg.gptq_enabled else "")
            )
            self.wrote_artifact(report, cfg, params)
        # The other ranks wait for the file through from_rank_0, not a collective: rank 0's export alone (the
        # per-group compressor takes minutes at the records' size) may outlast the collectives' timeout.
        backend.from_rank_0(
            f"pgolf/artifact_written:{artifact}", "" if self.main else None, RANK_0_WAIT_SECONDS
        )
        t_scoring = time.perf_counter()  # from the compressed file on disk, as the challenge times it
        backend.load_params(dequantize(read_pgolf_artifact(artifact)))
        figures: dict[str, float] = {}
        # The challenge's log names: final_int8_zlib_roundtrip (its baseline); final_int6_roundtrip and
        # final_int6_sliding_window (the records).
        prefix = f"final_int8_{cfg.compressor}" if label == "int8" else f"final_{label}"
        for name, evaluator in evaluators(cfg).items():
            t_eval = time.perf_counter()
            meter = evaluator(backend, self.data, self.watch)
            figure = RESULT_FIGURES[name]
            seconds = time.perf_counter() - t_eval
            figures[f"{figure}_val_loss"], figures[f"{figure}_val_bpb"] = meter.val_loss, meter.val_bpb
            figures[f"{figure}_eval_s"] = seconds
            tag = f"{prefix}_{'roundtrip' if name == 'plain' else name}"
            self.say(
                f"{tag} val_loss:{meter.val_loss:.4f} val_bpb:{meter.val_bpb:.4f} "
                f"eval_time:{1000 * seconds:.0f}ms protocol:{figure_protocol(name, cfg)}"
            )
            self.say(f"{tag}_exact val_loss:{meter.val_loss:.8f} val_bpb:{meter.val_bpb:.8f}")
            elapsed = time.perf_counter() - t_scoring
            if 0 < cfg.max_eval_seconds < elapsed:  # the challenge's limit, on its hardware
                self.say(
                    f"warning: evaluation at {elapsed:.0f}s, past {setting('max_eval_seconds', cfg.max_eval_seconds)}"
                )
        elapsed = time.perf_counter() - t_scoring
        self.say(f"total_eval_time:{elapsed:.1f}s (decompression included)")
        return RunResult(
            run_dir=self.run_dir.path,
            steps=self.step,
            train_time_ms=self.clock.ms(),
            val_loss=self.val_loss,
            val_bpb=self.val_bpb,
            artifact_bytes=sizes.get("model_bytes", 0),
            code_bytes=sizes.get("code_bytes", 0),
            artifact_sha256=file_sha256(artifact, "artifact") if self.main else "",
            peak_memory_bytes=self.peak_memory,
            eval_time_s=elapsed,
            **figures,
        )

    def artifact_settings(
        self, params: dict[str, np.ndarray], hessians: dict[str, np.ndarray] | None
    ) -> tuple[Config, MixedModel | None, Sequence[Path]]:
        """The config the artifact is written with, its quantized model when already made, and the
        training shards that chose them: the run's config (ManagedTraining's: the artifact fit's
        choice, `artifact_fit_bytes`, its files already beside the artifact)."""
        return self.cfg, None, ()

    def wrote_artifact(self, report: ExportReport, cfg: Config, params: dict[str, np.ndarray]) -> None:
        """Called on rank 0 once the artifact of `params` is written with `cfg` and its size logged."""

    def run(self) -> RunResult:
        cfg = self.cfg
        self.start()
        if cfg.warmup_steps > 0:
            self.warm_up()
        self.first_step = self.step
        self.first_ms = self.elapsed_ms = self.clock.ms()
        self.clock.start()
        while True:
            last = self.step == cfg.iterations or (
                self.stop_after is not None and self.step >= self.stop_after
            )
            self.stop_if_asked()
            if last or (cfg.val_loss_every > 0 and self.step % cfg.val_loss_every == 0):
                self.validate()
            if last:
                break
            self.train_step()
            if self.stop_after is None and self.reached_cap():
                self.stop_after = self.step
        self.clock.stop()
        if self.stop_after is not None and self.step < cfg.iterations:
            self.say(
                f"stopping_early: wallclock_cap train_time:{self.clock.ms():.0f}ms step:{self.step}/{cfg.iterations}"
            )
        self.peak_memory = self.backend.peak_memory_bytes()
        if self.peak_memory is not None:
            self.say(f"peak memory allocated: {self.peak_memory // 2**20} MiB")
        self.save_checkpoint()
        self.stop_if_asked()
        self.trained()
        result = self.export_and_score()
        self.metric(kind="final", **asdict(result))
        return result

    def after_step(self) -> None:
        """Called after each training step."""

    def trained(self) -> None:
        """Called once training is over and its weights checked (pgolf's `train`: its last checkpoint on disk)."""

    # ---------------------------------------------------------------- helpers
    def _score_plain(self) -> BPBMeter:
        """The weights the backend holds scored over non-overlapping sequences (val_loss, val_bpb)."""
        meter = evaluators(self.cfg)["plain"](self.backend, self.data, self.watch)
        self.val_loss, self.val_bpb = meter.val_loss, meter.val_bpb
        return meter

    def set_looping(self, active: bool) -> None:
        """Tell the backend which layer layout to run (depth recurrence); log a switch."""
        self.backend.set_looping(active)
        if active == self.looping:
            return
        self.looping = active
        encoder, decoder = self.cfg.layer_layout(active)
        self.say(
            f"layer_loop:{'enabled' if active else 'disabled'} step:{self.step} "
            f"encoder:{encoder} decoder:{decoder}"
        )

    def say(self, line: str) -> None:
        if self.main:
            self.log(line)
            self.run_dir.log_line(line)

    def metric(self, **record) -> None:
        if self.main:
            self.run_dir.metric(record)

    def agreed_ms(self) -> float:
        """The training clock every rank agrees on (their mean), so that the schedules and the cap match
        across ranks; one small all-reduce per step, only when several ranks run under a cap (without
        one, only steps are read, not the clock; ManagedTraining's timed checkpoints read it too)."""
        if self.cfg.train_cap_seconds > 0:
            return rank_mean(self.backend, self.clock.ms())
        return self.clock.ms()

    def reached_cap(self) -> bool:
        cap_s = self.cfg.train_cap_seconds
        return cap_s > 0 and self.elapsed_ms >= 1000.0 * cap_s

    def _micro_batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        cfg = self.cfg
        return [
            self.loader.next_batch(cfg.train_batch_tokens, cfg.train_seq_len, self.accum)
            for _ in range(self.accum)
        ]

    def _log_train(self, loss, lr_mult: float, momentum: float) -> None:
        """The training log line; the loss is averaged over ranks, so every rank stops alike on divergence."""
        cfg, backend = self.cfg, self.backend
        loss_value = rank_mean(backend, float(loss))
        problem = divergence(cfg, self.step, loss_value, backend.params)
        if problem is not None:
            raise PgolfError(
                f"training diverged: {problem} at step {self.step}; "
                f"lower the learning rates (the log is in {self.run_dir.path})"
            )
        elapsed_ms = self.clock.ms()  # after the loss sync, so the step time is honest
        step_avg = elapsed_ms / self.step
        run_ms = max(elapsed_ms - self.first_ms, 1e-9)  # the time of this process's steps
        tok_s = 1e3 * cfg.train_batch_tokens * (self.step - self.first_step) / run_ms
        peak = backend.peak_flops
        mfu = flops_per_token(cfg) * tok_s / (peak * backend.world_size) if peak else None
        self.say(
            f"step:{self.step}/{cfg.iterations} train_loss:{loss_value:.4f} train_time:{elapsed_ms:.0f}ms "
            f"step_avg:{step_avg:.2f}ms tok/s:{tok_s:,.0f} lr_mult:{lr_mult:.3f}"
            + (f" mfu:{100 * mfu:.1f}%" if mfu is not None else "")
        )
        self.metric(
            kind="train", step=self.step, train_loss=loss_value, train_time_ms=elapsed_ms, step_avg_ms=step_avg,
            tokens_per_s=tok_s, lr_mult=lr_mult, muon_momentum=momentum, mfu=mfu,
        )  # fmt: skip

    def _log_header(self) -> None:
        cfg, backend = self.cfg, self.backend
        self.say(
            f"backend:{backend.name} device:{backend.device} world_size:{backend.world_size} "
            f"grad_accum_steps:{self.accum} seed:{cfg.seed}"
        )
        self.say(
            f"model_params:{count_params(cfg)} layers:{cfg.num_layers} dim:{cfg.model_dim} heads:{cfg.num_heads}/"
            f"{cfg.num_kv_heads} vocab:{cfg.vocab_size} compute:{'bf16' if backend.bf16 else 'fp32'}"
        )
        self.say(
            f"train_batch_tokens:{cfg.train_batch_tokens} train_seq_len:{cfg.train_seq_len} "
            f"iterations:{cfg.iterations} warmup_steps:{cfg.warmup_steps} "
            f"max_wallclock_seconds:{cfg.max_wallclock_seconds:.3f} val_tokens:{len(self.data.tokens) - 1}"
        )
        self.say(
            f"eval_seq_len:{cfg.eval_window} eval_stride:{cfg.eval_stride} quant_format:{cfg.quant_format} "
            f"artifact:{quant_label(cfg)}+{cfg.compressor}"
            + (f"+shuffle{cfg.byte_shuffle}" if cfg.byte_shuffle else "")
        )
        if cfg.gptq_enabled and cfg.train_cap_seconds > 0:
            self.say(
                f"gptq:reserving {cfg.gptq_reserve_seconds:g}s for calibration, "
                f"training cap {1000 * cfg.train_cap_seconds:.0f}ms"
            )
        self.say(f"dataset:{cfg.dataset} data_path:{cfg.data_path} tokenizer_path:{cfg.tokenizer_path}")


def divergence(
    cfg: Config, step: int, loss: float, params: Callable[[], dict[str, np.ndarray]]
) -> str | None:
    """Why a run has diverged (see DIVERGENCE_AFTER_STEPS), or None; `params` is read only when the
    loss looks sane. The weights are the same on every rank, so every rank decides alike."""
    uniform = math.log(cfg.vocab_size)
    if not math.isfinite(loss):
        return f"train_loss is {loss}"
    if step >= DIVERGENCE_AFTER_STEPS and loss > uniform:
        return f"train_loss {loss:.4f} is above {uniform:.4f}, the loss of predicting every token as equally likely"
    rms = weights_rms(params())
    if not rms <= WEIGHT_RMS_LIMIT:
        return f"the weights' RMS is {rms:.3g} (the limit is {WEIGHT_RMS_LIMIT:g})"
    return None


def rank_mean(backend: Backend, value: float) -> float:
    """The mean of `value` over the ranks (the backends make no collective with one rank)."""
    return float(backend.all_reduce_sum(np.array([value]))[0]) / backend.world_size


def weights_rms(params: dict[str, np.ndarray]) -> float:
    """The root mean square of all weights together (NaN or inf when one of them is)."""
    weights = list(params.values())
    total = sum(float(np.square(w, dtype=np.float64).sum()) for w in weights)
    return math.sqrt(total / max(sum(w.size for w in weights), 1))


def check_budget(result: RunResult, cap: int) -> None:
    """A finished run over the byte cap (budget_bytes) ends so, exit status 3, once its backend is closed:
    its figures and artifact stay, it cannot be submitted."""
    total = result.artifact_bytes + result.code_bytes
    if total > cap:
        raise OverBudget(
            f"artifact + code are {total:,} bytes, {total - cap:,} over the {cap:,}-byte cap: not submittable "
            f"({result.run_dir})"
        )


def run_to_end(training: Training) -> RunResult:
    """Run `training` to its end and return the final figures; its run directory is closed however it ends."""
    try:
        return training.run()
    finally:
        if training.run_dir is not None:
            training.run_dir.close()


def train(backend: Backend, log: Log = print, code_bytes: int = 0) -> RunResult:
    """Train, validate and export one model with `backend.cfg`, as a packaged train_gpt.py does (no
    checkpoints, no resuming); return the final figures. `log` takes each log line; `code_bytes` is what
    counts as the run's code (a packaged script passes its own size). pgolf's `train` runs an
    `ManagedTraining` instead (core/train/managed.py: `train_managed`), which alone acts on
    core/config/features.py's PGOLF_ONLY settings (a packaged script refuses them before it starts)."""
    return run_to_end(Training(backend, log=log, code_bytes=code_bytes))
