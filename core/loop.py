"""The training driver, written once for both backends.

When to validate, stop, checkpoint, log and export; the wallclock clock and the
schedules; the data stream and the validation metric. A backend (see
`core.backend`) only takes steps and evaluates token spans.

The timeline follows the challenge's reference script: optional compile-warmup
steps that are then undone; validation at step 0, every `val_loss_every` steps
and at the end, with validation (and checkpoint) time off the training clock; a
wallclock cap that stops all ranks at the same step; the int8 export, then its
round trip: the artifact is read back from disk and scored again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core import quant
from core.backend import Backend
from core.bpb import BPBMeter
from core.checkpoint import Checkpoint, RunDir, is_checkpoint, load_checkpoint, save_checkpoint
from core.config import Config
from core.errors import PgolfError
from core.params import (
    config_for_params,
    flops_per_token,
    init_params,
    optimizer_state_shapes,
    param_shapes,
    storage_dtypes,
)
from core.schedule import lr_multiplier, muon_momentum
from core.shards import BatchLoader, find_shards, load_val_tokens, val_spans
from core.tokenizer import ByteTables, byte_tables, check_vocab, load_tokenizer

Log = Callable[[str], None]
Progress = Callable[[int, int], None]  # (done, total) for long validation passes


@dataclass
class EvalData:
    """What scoring needs: the validation tokens and the tokenizer's byte tables."""

    tokens: np.ndarray
    tables: ByteTables


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    train_time_ms: float
    val_loss: float  # final validation before quantization
    val_bpb: float
    roundtrip_val_loss: float  # the score: after the int8 artifact round trip
    roundtrip_val_bpb: float
    artifact_bytes: int
    code_bytes: int
    peak_memory_bytes: int | None


def load_eval_data(cfg: Config) -> EvalData:
    sp = load_tokenizer(cfg.tokenizer_path)
    check_vocab(sp, cfg.vocab_size, cfg.tokenizer_path)
    tokens = load_val_tokens(
        find_shards(cfg.data_path, "val"), cfg.train_seq_len, cfg.val_max_tokens, cfg.vocab_size
    )
    return EvalData(tokens=tokens, tables=byte_tables(sp, cfg.vocab_size))


def evaluate(backend: Backend, cfg: Config, data: EvalData, progress: Progress | None = None) -> BPBMeter:
    """val_loss and val_bpb over this rank's share of the validation tokens, summed over ranks."""
    seq = cfg.train_seq_len
    batch_seqs = max(cfg.val_batch_size // cfg.grad_accum_steps // seq, 1)
    spans = val_spans(len(data.tokens), seq, batch_seqs, backend.rank, backend.world_size)
    meter = BPBMeter(data.tables)
    for i, (start, end) in enumerate(spans):
        chunk = data.tokens[start:end].astype(np.int32)
        x, y = chunk[:-1].reshape(-1, seq), chunk[1:].reshape(-1, seq)
        meter.add(backend.eval_nll(x, y), x, y)
        if progress is not None:
            progress(i + 1, len(spans))
    return BPBMeter.from_array(data.tables, backend.all_reduce_sum(meter.as_array()))


def code_paths(backend_name: str) -> list[Path]:
    """The source files a submission of this backend needs: core, the backend package, the CLI."""
    root = Path(__file__).resolve().parent.parent
    package = {"cuda": "cuda_train", "mlx": "mlx_train"}[backend_name]
    files = sorted((root / "core").glob("*.py")) + sorted((root / package).glob("*.py"))
    return [*files, root / "cli.py"]


def export_artifact(
    params: dict[str, np.ndarray],
    dtypes: dict[str, str],
    path: Path,
    backend_name: str,
    compressor: str = "zlib",
    upstream: bool = False,
) -> dict[str, int]:
    """Quantize, write the artifact (pgolf's container, or the challenge's), report its bytes."""
    model = quant.quantize_int8(params, dtypes)
    if upstream:
        quant.save_upstream_torch(path, model)
    else:
        quant.save_artifact(path, model, compressor=compressor)
    return quant.size_report(
        payload_bytes=model.stats["int8_payload_bytes"],
        model_bytes=path.stat().st_size,
        code_bytes=quant.code_bytes(code_paths(backend_name)),
    )


def load_weights(
    path: str | Path, cfg: Config, allow_pickle: bool = False
) -> tuple[dict[str, np.ndarray], Config]:
    """Float32 weights from a checkpoint or an artifact (pgolf or upstream), and the config they fit.

    A checkpoint brings its own model config; for an artifact the shape is read
    off the tensors. Data paths and evaluation settings always come from `cfg`.
    """
    cfg.validate()
    if is_checkpoint(path):
        params = load_checkpoint(path).params
    else:
        params = quant.dequantize_int8(quant.load_artifact(path, allow_pickle=allow_pickle))
    return params, config_for_params(cfg, {k: tuple(v.shape) for k, v in params.items()}).validate()


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


def train(
    cfg: Config,
    backend: Backend,
    *,
    resume: str | Path | None = None,
    log: Log = print,
    progress: Progress | None = None,
    step_progress: Progress | None = None,
) -> RunResult:
    """Train, validate, checkpoint and export one model; return the final figures.

    `progress` follows each validation pass and `step_progress` the training steps,
    as (done, expected total); under a wallclock cap the total is where the cap
    will stop the run at the current pace.
    """
    world, rank = backend.world_size, backend.rank
    cfg.validate(world)
    main = rank == 0
    accum = cfg.local_accum_steps(world)
    # Everything that can be refused is checked before the run directory exists.
    data = load_eval_data(cfg)
    loader = BatchLoader(find_shards(cfg.data_path, "train"), rank, world, cfg.vocab_size)
    dtypes = storage_dtypes(cfg, backend.bf16)
    step, train_time_ms = 0, 0.0
    if resume is not None:
        ckpt = load_checkpoint(resume)
        _check_same_model(cfg, ckpt, resume)
        if ckpt.step > cfg.iterations:
            raise PgolfError(
                f"checkpoint {resume} is at step {ckpt.step}, past iterations={cfg.iterations}: "
                "raise --iterations to train on"
            )
        backend.load_params(ckpt.params)
        backend.load_optimizer_state(ckpt.optimizer)
        loader.load_state(ckpt.data_state)
        step, train_time_ms = ckpt.step, ckpt.train_time_ms
    else:
        backend.load_params(init_params(cfg, bf16=backend.bf16))
    run_id = _shared_run_id(cfg, backend)
    # A resumed run goes on writing into its own directory, and into no other run's.
    own_run = resume is not None and Path(resume).resolve().is_relative_to(
        (Path(cfg.out_dir) / run_id).resolve()
    )
    run = RunDir(cfg.out_dir, run_id, enabled=main, reuse=own_run)

    def say(line: str) -> None:
        if main:
            log(line)
            run.log_line(line)

    run.write_config(cfg.to_dict())
    if resume is not None:
        say(f"resumed:{resume} step:{step} train_time:{train_time_ms:.0f}ms")

    n_params = sum(int(np.prod(s)) for s in param_shapes(cfg).values())
    say(f"backend:{backend.name} device:{backend.device} world_size:{world} grad_accum_steps:{accum}")
    say(
        f"model_params:{n_params} layers:{cfg.num_layers} dim:{cfg.model_dim} heads:{cfg.num_heads}/"
        f"{cfg.num_kv_heads} vocab:{cfg.vocab_size} compute:{'bf16' if backend.bf16 else 'fp32'}"
    )
    say(
        f"train_batch_tokens:{cfg.train_batch_tokens} train_seq_len:{cfg.train_seq_len} "
        f"iterations:{cfg.iterations} warmup_steps:{cfg.warmup_steps} "
        f"max_wallclock_seconds:{cfg.max_wallclock_seconds:.3f} val_tokens:{len(data.tokens) - 1}"
    )
    say(f"run_dir:{run.path}")

    def next_micro_batches() -> list[tuple[np.ndarray, np.ndarray]]:
        return [loader.next_batch(cfg.train_batch_tokens, cfg.train_seq_len, accum) for _ in range(accum)]

    if cfg.warmup_steps > 0 and resume is None:
        # Prime compiled paths, then restore the true initial state and rewind the data.
        params0, opt0, data0 = backend.params(), backend.optimizer_state(), loader.state()
        for i in range(cfg.warmup_steps):
            backend.train_step(next_micro_batches(), lr_multiplier(cfg, 0, 0.0), muon_momentum(cfg, 0))
            if cfg.warmup_steps <= 20 or (i + 1) % 10 == 0 or i + 1 == cfg.warmup_steps:
                say(f"warmup_step:{i + 1}/{cfg.warmup_steps}")
        backend.load_params(params0)
        backend.load_optimizer_state(opt0)
        loader.load_state(data0)

    cap_ms = 1000.0 * cfg.max_wallclock_seconds if cfg.max_wallclock_seconds > 0 else None
    flops_per_tok = flops_per_token(cfg)
    stop_after: int | None = None
    val_loss = val_bpb = math.nan
    backend.synchronize()
    t0 = time.perf_counter()

    def clock_ms() -> float:
        return train_time_ms + 1000.0 * (time.perf_counter() - t0)

    def write_checkpoint() -> None:
        if main:
            save_checkpoint(
                run.checkpoint_path(step),
                Checkpoint(
                    params=backend.params(),
                    optimizer=backend.optimizer_state(),
                    config=cfg.to_dict(),
                    step=step,
                    train_time_ms=train_time_ms,
                    data_state=loader.state(),
                    backend=backend.name,
                    dtypes=dtypes,
                ),
            )

    start_step, start_ms = step, train_time_ms
    while True:
        last = step == cfg.iterations or (stop_after is not None and step >= stop_after)
        if last or (cfg.val_loss_every > 0 and step % cfg.val_loss_every == 0):
            backend.synchronize()
            train_time_ms = clock_ms()
            meter = evaluate(backend, cfg, data, progress if main else None)
            val_loss, val_bpb = meter.val_loss, meter.val_bpb
            say(
                f"step:{step}/{cfg.iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                f"train_time:{train_time_ms:.0f}ms step_avg:{train_time_ms / max(step, 1):.2f}ms"
            )
            if main:
                run.metric(
                    {"kind": "val", "step": step, "val_loss": val_loss, "val_bpb": val_bpb,
                     "train_time_ms": train_time_ms}
                )  # fmt: skip
            backend.synchronize()
            t0 = time.perf_counter()
        if last:
            if stop_after is not None and step < cfg.iterations:
                say(
                    f"stopping_early: wallclock_cap train_time:{train_time_ms:.0f}ms step:{step}/{cfg.iterations}"
                )
            break

        lr_mult = lr_multiplier(cfg, step, clock_ms())
        momentum = muon_momentum(cfg, step)
        loss = backend.train_step(next_micro_batches(), lr_mult, momentum)
        step += 1
        elapsed_ms = clock_ms()
        if main and step_progress is not None:
            expected = cfg.iterations
            if cap_ms is not None:  # the cap may come first
                ms_per_step = (elapsed_ms - start_ms) / (step - start_step)
                expected = min(
                    expected, step + math.ceil(max(cap_ms - elapsed_ms, 0) / max(ms_per_step, 1e-9))
                )
            step_progress(step, expected)
        if cfg.train_log_every > 0 and (
            step <= 10 or step % cfg.train_log_every == 0 or stop_after is not None
        ):
            loss_value = float(loss)
            if not math.isfinite(loss_value):
                raise PgolfError(
                    f"training diverged: train_loss is {loss_value} at step {step}; "
                    f"lower the learning rates (the log is in {run.path})"
                )
            elapsed_ms = clock_ms()  # after the loss sync, so the step time is honest
            step_avg = elapsed_ms / step
            run_ms = max(elapsed_ms - start_ms, 1e-9)  # this process's share of the clock
            tok_s = 1e3 * cfg.train_batch_tokens * (step - start_step) / run_ms
            mfu = flops_per_tok * tok_s / (backend.peak_flops * world) if backend.peak_flops else None
            say(
                f"step:{step}/{cfg.iterations} train_loss:{loss_value:.4f} train_time:{elapsed_ms:.0f}ms "
                f"step_avg:{step_avg:.2f}ms tok/s:{tok_s:,.0f} lr_mult:{lr_mult:.3f}"
                + (f" mfu:{100 * mfu:.1f}%" if mfu is not None else "")
            )
            if main:
                run.metric(
                    {"kind": "train", "step": step, "train_loss": loss_value, "train_time_ms": elapsed_ms,
                     "step_avg_ms": step_avg, "tokens_per_s": tok_s, "lr_mult": lr_mult,
                     "muon_momentum": momentum, "mfu": mfu}
                )  # fmt: skip
        if cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0 and step < cfg.iterations:
            backend.synchronize()
            train_time_ms = clock_ms()
            write_checkpoint()
            t0 = time.perf_counter()
        reached_cap = cap_ms is not None and clock_ms() >= cap_ms
        if world > 1 and cap_ms is not None:
            reached_cap = backend.all_reduce_sum(np.array([float(reached_cap)]))[0] > 0
        if stop_after is None and reached_cap:
            stop_after = step

    if main and step_progress is not None:
        step_progress(step, step)  # training is over, wherever it stopped
    peak = backend.peak_memory_bytes()
    if peak is not None:
        say(f"peak memory allocated: {peak // 2**20} MiB")
    write_checkpoint()

    # Export, then score what was written: the artifact read back from disk.
    report: dict[str, int] = {}
    if main:
        report = export_artifact(backend.params(), dtypes, run.artifact, backend.name)
        say(
            f"artifact:{run.artifact} int8_payload:{report['payload_bytes']} "
            f"model_bytes:{report['model_bytes']} code_bytes:{report['code_bytes']} "
            f"total:{report['total_bytes']} budget:{report['budget_bytes']} "
            f"({'fits' if report['total_bytes'] <= report['budget_bytes'] else 'OVER BUDGET'})"
        )
    backend.all_reduce_sum(np.zeros(1))  # barrier: the artifact is on disk
    backend.load_params(quant.dequantize_int8(quant.load_artifact(run.artifact)))
    t_eval = time.perf_counter()
    meter = evaluate(backend, cfg, data, progress if main else None)
    say(
        f"final_int8_roundtrip val_loss:{meter.val_loss:.4f} val_bpb:{meter.val_bpb:.4f} "
        f"eval_time:{1000 * (time.perf_counter() - t_eval):.0f}ms"
    )
    say(f"final_int8_roundtrip_exact val_loss:{meter.val_loss:.8f} val_bpb:{meter.val_bpb:.8f}")
    result = RunResult(
        run_dir=run.path,
        steps=step,
        train_time_ms=train_time_ms,
        val_loss=val_loss,
        val_bpb=val_bpb,
        roundtrip_val_loss=meter.val_loss,
        roundtrip_val_bpb=meter.val_bpb,
        artifact_bytes=report.get("model_bytes", 0),
        code_bytes=report.get("code_bytes", 0),
        peak_memory_bytes=peak,
    )
    if main:
        run.metric(
            {"kind": "final", **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(result).items()}}
        )
    return result


def _check_same_model(cfg: Config, ckpt: Checkpoint, path: str | Path) -> None:
    """The checkpoint holds every parameter and optimizer tensor this config needs, in its shape."""
    for tensors, what, shapes in (
        (ckpt.params, "", param_shapes(cfg)),
        (ckpt.optimizer, "optimizer state ", optimizer_state_shapes(cfg)),
    ):
        for name, shape in shapes.items():
            got = tensors.get(name)
            if got is None or tuple(got.shape) != shape:
                found = "missing" if got is None else f"shape {tuple(got.shape)}"
                raise PgolfError(
                    f"checkpoint {path}: {what}{name} is {found}, but the config expects {shape}"
                )
    step = ckpt.optimizer["step"]
    if step.dtype.kind not in "iu" or int(step) < 0:
        raise PgolfError(f"checkpoint {path}: optimizer step must be a whole number >= 0, got {step}")
