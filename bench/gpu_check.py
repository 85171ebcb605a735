"""pgolf's acceptance check on one CUDA GPU: one command, at most about 8 minutes, two files of results.

    python bench/gpu_check.py OUT --challenge-script PATH/train_gpt.py

writes OUT/gpu_check.json and OUT/gpu_check.md (and OUT/gpu_check.log: every part's output, then each
run's and the tests'). The parts,
in the order they run, each in a process of its own under its own time limit (a part that fails, hangs
or crashes is one line of the report, and the next part runs):

    env       the GPU's name, driver, torch, CUDA, cuDNN and Triton versions, FlashAttention if installed
    compile   torch.compile (fullgraph) of the training step (document-masked attention, loops, lanes),
              the evaluation forward and test-time training's LoRA forward: graphs, graph breaks, and
              the compiles after the warm-up (must be 0)
    record    record_0427 at its real shape: ms/step, tokens/s, peak memory, MFU, the attention kernel
    baseline  the `baseline` preset on the embedded corpus beside the challenge's own train_gpt.py,
              the same steps on the same GPU, in rounds whose order alternates: ms/step, tokens/s, the
              ratio, peak memory, the final val_bpb of each
    verify    the baseline run's artifact scored on the GPU and on the CPU (and by MLX where installed)
    tests     the tests marked `cuda` (pytest -m cuda), on the GPU

`--dry-run` runs the same parts on a CPU at tiny shapes and few steps (the test suite runs it), the ones
that need a GPU reported as skipped. The exit status is 0 when no part failed, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.common.files import write_atomic  # noqa: E402

# name -> (seconds allowed on a GPU, on a CPU in the dry run); the order is the order they run in.
PARTS = {
    "env": (30, 60),
    "compile": (120, 120),
    "record": (150, 90),
    "baseline": (270, 120),
    "verify": (60, 90),
    "tests": (120, 90),
}
BUDGET_SECONDS = 480  # the whole check; a part starts only with at least MIN_PART_SECONDS of it left
MIN_PART_SECONDS = 15
DRY = dict(  # the dry run's model: the smoke preset's size, fp32, nothing compiled
    num_layers=2, model_dim=64, num_heads=4, num_kv_heads=2, train_seq_len=64, train_batch_tokens=512,
    grad_accum_steps=1, compute_dtype="float32", compile="off",
)  # fmt: skip
# Attention as a profile names it: aten's SDPA kernels (the op, and its CUDA kernels), FlashAttention's own.
ATTENTION_KERNELS = [
    ("flash_attn", "FlashAttention (flash_attn package)"),
    ("_scaled_dot_product_flash_attention_for_cpu", "SDPA flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "SDPA flash"),
    ("flash_fwd", "SDPA flash"),
    ("_scaled_dot_product_cudnn_attention", "SDPA cuDNN"),
    ("cudnn_generated_fort_native_sdpa", "SDPA cuDNN"),
    ("_scaled_dot_product_efficient_attention", "SDPA memory-efficient"),
    ("_efficient_attention_forward", "SDPA memory-efficient"),
    ("fmha_cutlass", "SDPA memory-efficient"),
    ("_scaled_dot_product_attention_math", "SDPA math"),
]
STEP_LINE = re.compile(r"step:(\d+)/(\d+) .*?step_avg:([\d.]+)ms")
PEAK_LINE = re.compile(r"peak memory allocated: (\d+) MiB")
ROUNDTRIP_LINE = re.compile(r"final_int8_zlib_roundtrip_exact val_loss:([\d.]+) val_bpb:([\d.]+)")


class Skip(Exception):
    """A part that cannot run here (no GPU, no script): reported as skipped, with the reason."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as pgolf's commands say a bad flag
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json, gpu_check.md and gpu_check.log")
    parser.add_argument(
        "--challenge-script",
        default=os.environ.get("PGOLF_CHALLENGE_TRAIN_GPT", ""),
        help="the challenge's train_gpt.py (or PGOLF_CHALLENGE_TRAIN_GPT); without it that side is skipped",
    )
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: tiny shapes, few steps")
    parser.add_argument(
        "--work",
        type=Path,
        help="folder for the data, runs and logs (default: OUT/work; it is not kept small)",
    )
    parser.add_argument(
        "--data-root", type=Path, help="a data folder holding sotu_sp1024 already (data prepare)"
    )
    parser.add_argument("--steps", type=int, help="baseline steps each side (default 200; dry run 2)")
    parser.add_argument(
        "--rounds", type=int, help="baseline rounds, as many as fit its time (default 2; dry run 1)"
    )
    parser.add_argument("--record-steps", type=int, help="record_0427 timed steps (default 50; dry run 1)")
    parser.add_argument("--budget", type=float, default=BUDGET_SECONDS, help="seconds for the whole check")
    parser.add_argument("--only", default="", help="comma-separated parts to run (default: all)")
    parser.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)  # one part, in a child process
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # the child's, as time.time()
    args = parser.parse_args(argv)
    if args.challenge_script and not Path(args.challenge_script).is_file():
        parser.error(f"--challenge-script {args.challenge_script}: no such file")
    unknown = [p for p in args.only.split(",") if p and p not in PARTS]
    if unknown:
        parser.error(f"--only: no part {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    args.steps = args.steps or (2 if args.dry_run else 200)
    args.rounds = args.rounds or (1 if args.dry_run else 2)
    args.record_steps = args.record_steps or (1 if args.dry_run else 50)
    args.work = args.work or args.out / "work"
    return args


# ------------------------------------------------------------------------------------------ the parts
def part_env(args: argparse.Namespace) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "commit": _git_commit(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from cuda_train.varlen import flash_varlen

    info["flash_attn"] = flash_varlen() is not None
    try:  # pip-installed, or run from the checkout alone (both work)
        info["pgolf_installed"] = metadata.version("pgolf")
    except metadata.PackageNotFoundError:
        info["pgolf_installed"] = None
    if not torch.cuda.is_available():
        return {"summary": f"torch {torch.__version__} on the CPU (no CUDA device)", **info}
    props = torch.cuda.get_device_properties(0)
    info.update(
        gpu=props.name,
        gpus=torch.cuda.device_count(),
        capability=f"{props.major}.{props.minor}",
        memory_gib=round(props.total_memory / 2**30, 1),
        multiprocessors=props.multi_processor_count,
        cudnn=torch.backends.cudnn.version(),
        driver=_nvidia_smi("driver_version"),
    )
    summary = f"{info['gpu']}, driver {info['driver']}, torch {info['torch']}, CUDA {info['cuda']}"
    return {"summary": summary, **info}


def part_compile(args: argparse.Namespace) -> dict:
    """Warm up every compiled function on every shape and switch a run gives it, then do it all again
    with new values: nothing may compile a second time. fullgraph=True makes a graph break an error;
    dynamo's counters and `explain` count them as well."""
    import numpy as np
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from core.config.presets import preset
    from core.model.params import init_params
    from cuda_train.backend import create_backend

    cuda = torch.cuda.is_available()
    if cuda:
        cfg = preset("record_0427_tiny").replace(compile="on", compute_dtype="bfloat16")
    else:  # dynamo's graphs, guards and recompiles as on a GPU, without AOT autograd and inductor (minutes
        # on a CPU), of the smoke model with document masking only
        cfg = preset("smoke").replace(compile="on", compile_backend="eager", varlen_attn_enabled=True)
    torch._dynamo.reset()
    counters.clear()
    backend = create_backend(cfg)
    backend.load_params(init_params(cfg, bf16=backend.bf16))
    rng = np.random.default_rng(0)
    seqs = cfg.train_batch_tokens // cfg.grad_accum_steps // cfg.train_seq_len

    def rows(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = rng.integers(0, cfg.vocab_size, size=(n, length + 1), dtype=np.int32)
        tokens[:, length // 3] = cfg.bos_id  # a second document in every row: the mask has work to do
        return tokens[:, :-1].copy(), tokens[:, 1:].copy()

    micro = [rows(seqs, cfg.train_seq_len) for _ in range(cfg.grad_accum_steps)]
    ttt = backend.ttt()
    adapters = ttt.new_adapters(_lora_a(cfg, seqs))

    def run_everything(lr: float, momentum: float, ttt_lengths: tuple[int, ...]) -> None:
        for looping in (False, True):  # the record turns its loops on mid-run
            backend.set_looping(looping)
            float(backend.train_step(micro, lr, momentum))
            x, y = rows(seqs + 1, cfg.train_seq_len)
            float(backend.eval_nll(x[:seqs], y[:seqs]) + backend.eval_nll(x[seqs:], y[seqs:]))
            for length in ttt_lengths:  # each batch of documents has its own window length
                x, y = rows(seqs, length)
                ttt.score_then_adapt(adapters, x, y, np.ones(seqs, bool), 0, length // 2)

    t0 = time.time()
    run_everything(1.0, cfg.muon_momentum, (cfg.train_seq_len // 2, cfg.train_seq_len // 2 + 8))
    warm = _compile_counts(counters)
    # (the last line of the log is the report's if the part runs out of time)
    print(
        f"warm-up done in {time.time() - t0:.0f} s: {warm['graphs']} graphs, {warm['breaks']} graph breaks",
        flush=True,
    )
    counters.clear()
    run_everything(0.5, cfg.muon_momentum * 0.98, (cfg.train_seq_len // 2 + 16, cfg.train_seq_len))
    after = _compile_counts(counters)
    explained = _explain_breaks(backend, micro[0])
    result = {
        "config": "record_0427_tiny, bf16, inductor"
        if cuda
        else "smoke + varlen_attn_enabled, fp32, dynamo alone",
        "graphs_at_warmup": warm["graphs"],
        "graph_breaks": warm["breaks"] + after["breaks"],
        "recompiles_after_warmup": after["graphs"],
        "explain": explained,
    }
    failed = result["graph_breaks"] or result["recompiles_after_warmup"] or explained.get("graph_breaks")
    result["summary"] = (
        f"{warm['graphs']} graphs compiled at warm-up; {result['graph_breaks']} graph breaks; "
        f"{after['graphs']} compiles after warm-up; explain: {explained.get('summary')}"
    )
    if failed:
        raise PartFailed(result)
    return result


def part_record(args: argparse.Namespace) -> dict:
    import torch

    from core.config.presets import preset
    from core.model.memory import check_config
    from core.model.params import flops_per_token
    from core.train.bench import benchmark
    from cuda_train.backend import create_backend

    cuda = torch.cuda.is_available()
    cfg = preset("record_0427") if cuda else preset("record_0427_tiny").replace(**{**DRY, "num_layers": 4})
    check_config("cuda", cfg)
    backend = create_backend(cfg)
    warmup = 3 if cuda else 0
    print(
        f"record_0427{'' if cuda else '_tiny'}: {warmup} warm-up and {args.record_steps} timed steps",
        flush=True,
    )
    result = benchmark(backend, steps=args.record_steps, warmup=warmup).as_dict()
    print(f"{result['ms_per_step']:,.1f} ms/step; profiling one step", flush=True)
    result["flops_per_token"] = flops_per_token(cfg)
    result["peak_bf16_flops"] = backend.peak_flops
    result["attention"] = _attention_kernels(backend)
    result["shape"] = (
        f"{cfg.num_layers}x{cfg.model_dim}, vocab {cfg.vocab_size}, {cfg.train_batch_tokens:,} tokens/step "
        f"in {cfg.grad_accum_steps} micro-batches of seq {cfg.train_seq_len}, loops "
        + ("on (as from enable_looping_at)" if backend.looping else "off")
    )
    mfu = "n/a (no bf16 peak known)" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    peak = result["peak_memory_mib"]
    result["summary"] = (
        f"{'record_0427' if cuda else 'record_0427_tiny, reduced'}: {result['ms_per_step']:,.1f} ms/step, "
        f"{result['tokens_per_s']:,.0f} tok/s, peak {'n/a' if peak is None else f'{peak:,.0f} MiB'}, MFU {mfu}, "
        f"attention: {', '.join(result['attention']) or 'none seen'}"
    )
    return result


def part_baseline(args: argparse.Namespace) -> dict:
    """pgolf's `train --preset baseline` and the challenge's train_gpt.py on the same shards, each as a
    whole run: warm-up, the timed steps, the final validation and export. Rounds alternate which goes first;
    a round starts only when the part's time still holds one as long as the first."""
    import torch

    cuda = torch.cuda.is_available()
    data_path, tokenizer_path = _dataset(args)
    script = args.challenge_script
    challenge_skip = None
    if not script:
        challenge_skip = "no --challenge-script given"
    elif not cuda:
        challenge_skip = "the challenge's train_gpt.py needs CUDA"
    sides = {"pgolf": _pgolf_command, "challenge": _challenge_command}
    runs: list[dict] = []
    round_seconds = 0.0
    for r in range(args.rounds):
        left = args.deadline - time.time()
        if r and left < 1.1 * round_seconds:
            runs.append({"round": r + 1, "skipped": f"needs ~{round_seconds:.0f} s, {left:.0f} s left"})
            break
        t0 = time.time()
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            if side == "challenge" and challenge_skip:
                continue
            cmd, env, cwd = sides[side](args, r + 1, data_path, tokenizer_path)
            runs.append({"round": r + 1, "side": side, **_timed_run(cmd, env, cwd, args, f"{side}_{r + 1}")})
        round_seconds = time.time() - t0
        if any(run.get("error") for run in runs):
            break
    result = {"runs": runs, "data_path": str(data_path), "steps": args.steps}
    if challenge_skip:
        result["challenge_skipped"] = challenge_skip
    figures = {}
    for side in sides:
        done = [run for run in runs if run.get("side") == side and "ms_per_step" in run]
        if done:
            ms = sorted(run["ms_per_step"] for run in done)[len(done) // 2]
            figures[side] = {
                "ms_per_step": ms,
                "tokens_per_s": done[0]["tokens_per_step"] / ms * 1000,
                "peak_memory_mib": max((run.get("peak_memory_mib") or 0) for run in done) or None,
                "val_bpb": done[0].get("val_bpb"),
            }
    result["figures"] = figures
    bad = [run for run in runs if run.get("error")]
    parts = [
        f"{side} {f['ms_per_step']:,.1f} ms/step, {f['tokens_per_s']:,.0f} tok/s"
        + (f", peak {f['peak_memory_mib']:,} MiB" if f["peak_memory_mib"] else "")
        + (f", val_bpb {f['val_bpb']:.4f}" if f["val_bpb"] is not None else "")
        for side, f in figures.items()
    ]
    if len(figures) == 2:
        ratio = figures["challenge"]["ms_per_step"] / figures["pgolf"]["ms_per_step"]
        result["ratio_pgolf_over_challenge_tokens_per_s"] = ratio
        parts.append(f"ratio {ratio:.3f}x (above 1: pgolf faster)")
    if challenge_skip:
        parts.append(f"challenge skipped: {challenge_skip}")
    rounds = len({run["round"] for run in runs if "side" in run})
    result["summary"] = f"{args.steps} steps, {rounds} round(s): " + "; ".join(parts)
    if bad or "pgolf" not in figures:
        result["summary"] += "; " + "; ".join(
            f"{run['side']} round {run['round']}: {run['error']}" for run in bad
        )
        raise PartFailed(result)
    return result


def part_verify(args: argparse.Namespace) -> dict:
    from unittest import mock

    import torch

    from core.eval import verify as check
    from core.model import backend as backends
    from core.runs.setup import weights_and_data

    found = sorted((args.work / "runs").glob("pgolf_*/final_model.int8.pgolf"))
    if not found:
        raise Skip("no artifact: the baseline part made none")
    path = found[0]
    tokens = 65_536 if torch.cuda.is_available() else 4096
    params, cfg, data = weights_and_data(path, None, None, {"val_max_tokens": tokens}, False)
    factories = {}
    for info in backends.installed():
        label = (
            info.name if info.name != "cuda" else ("torch-gpu" if torch.cuda.is_available() else "torch-cpu")
        )
        factories[label] = lambda c, name=info.name: backends.create(name, c)
    if torch.cuda.is_available():  # the same backend with the GPU hidden: it picks the CPU when it is built

        def on_cpu(c):
            with mock.patch.object(torch.cuda, "is_available", return_value=False):
                return backends.create("cuda", c)

        factories["torch-cpu"] = on_cpu
    verdict = check.verify(params, cfg, data, factories)
    result = {
        "artifact": str(path),
        "scores": {
            s.backend: {"device": s.device, "tokens": s.tokens, **dict(s.figures)} for s in verdict.scores
        },
        "bpb_diffs": verdict.bpb_diffs,
        "max_logit_diff": verdict.max_logit_diff,
        "agree": verdict.agree,
    }
    figures = ", ".join(f"{s.backend} {s.figures['plain'][1]:.6f}" for s in verdict.scores)
    result["summary"] = (
        f"val_bpb {figures} on {tokens:,} tokens; max |val_bpb diff| {max(verdict.bpb_diffs.values()):.1e}, "
        f"max |logit diff| {verdict.max_logit_diff:.1e}: " + ("agree" if verdict.agree else "DISAGREE")
    )
    if len(verdict.scores) < 2:
        result["summary"] += " (one backend: nothing to compare against)"
    if not verdict.agree:
        raise PartFailed(result)
    return result


def part_tests(args: argparse.Namespace) -> dict:
    """On a GPU the `cuda` tests run; in the dry run they are only collected (the suite runs them)."""
    import torch

    junit = args.work / "tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-n", "0", "-q", "-p", "no:cacheprovider", "-rfE"]
    if not torch.cuda.is_available():
        cmd.append("--collect-only")
    cmd += [f"--junitxml={junit}", *_cuda_test_files()]
    run = _run(cmd, None, ROOT, args, "tests")
    lines = run["tail"]
    if not torch.cuda.is_available():
        collected = _collected(lines)
        if run["returncode"] != 0 or not collected:
            raise PartFailed({"summary": f"collecting the cuda tests failed: {_last_line(lines)}"})
        return {
            "collected": collected,
            "summary": f"{collected} cuda tests collected; they run on a GPU only",
        }
    counts = _junit_counts(junit)
    result = {**counts, "summary": f"pytest -m cuda: {_last_line(lines)}"}
    if run["returncode"] not in (0,) or counts.get("failures") or counts.get("errors"):
        result["failed_tests"] = [line for line in lines if line.startswith(("FAILED", "ERROR"))][:20]
        raise PartFailed(result)
    return result


# -------------------------------------------------------------------------------------- the parts' help
class PartFailed(Exception):
    """A part that ran and found something wrong: its figures, and the line saying what."""

    def __init__(self, result: dict):
        super().__init__(result.get("summary", "failed"))
        self.result = result


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _lora_a(cfg, batch: int) -> dict:
    import numpy as np

    from core.model.lora import initial_a

    return initial_a(cfg, batch, np.random.default_rng(0))


def _compile_counts(counters) -> dict:
    """Graphs dynamo made and graph breaks it met since the counters were cleared (torch 2.5 to 2.14)."""
    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "breaks": int(sum(counters["graph_break"].values())),
    }


def _explain_breaks(backend, batch) -> dict:
    """torch._dynamo.explain over the model's training forward: its own count of graphs and breaks."""
    import torch
    import torch._dynamo

    x, y = (backend.to_device(a) for a in batch)
    try:
        with backend.autocast:
            out = torch._dynamo.explain(backend.model)(x, y, looping=backend.looping)
    except Exception as error:  # an API that moved: the counters above still stand
        return {"summary": f"unavailable ({type(error).__name__}: {_first_line(str(error))})"}
    reasons = [_first_line(str(getattr(r, "reason", r))) for r in getattr(out, "break_reasons", [])]
    return {
        "graphs": out.graph_count,
        "graph_breaks": out.graph_break_count,
        "break_reasons": reasons[:10],
        "summary": f"{out.graph_count} graph(s), {out.graph_break_count} break(s) in the training forward",
    }


def _attention_kernels(backend) -> list[str]:
    """Which attention kernels one training step ran, as torch.profiler saw its ops and CUDA kernels."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = backend.cfg
    seqs = cfg.train_batch_tokens // cfg.grad_accum_steps // cfg.train_seq_len
    tokens = np.random.default_rng(1).integers(
        0, cfg.vocab_size, size=(seqs, cfg.train_seq_len + 1), dtype=np.int32
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=activities) as prof:
            float(backend.train_step([(tokens[:, :-1].copy(), tokens[:, 1:].copy())], 1.0, cfg.muon_momentum))
            backend.synchronize()
        names = {event.name for event in prof.events()}
    except Exception as error:  # a profiler a virtual machine refuses: the step's figures still stand
        return [f"unknown (the profiler failed: {type(error).__name__}: {_first_line(str(error))})"]
    seen: list[str] = []
    for name in sorted(names):
        for key, label in ATTENTION_KERNELS:
            if key in name:
                if label not in seen:
                    seen.append(label)
                break
    return seen


def _dataset(args: argparse.Namespace) -> tuple[Path, Path]:
    """The embedded corpus's sp1024 shards and tokenizer: --data-root's, or prepared under the work folder."""
    root = args.data_root or args.work / "data"
    data, tokenizer = root / "datasets" / "sotu_sp1024", root / "tokenizers" / "sotu_1024_bpe.model"
    if not (tokenizer.is_file() and any(data.glob("fineweb_val_*.bin"))):
        from core.datasets.embedded import prepare_sotu

        prepare_sotu(root, vocab_size=1024, limit_docs=40 if args.dry_run else None)
    return data.resolve(), tokenizer.resolve()


def _pgolf_command(args, r: int, data: Path, tokenizer: Path) -> tuple[list[str], dict, Path]:
    cmd = [
        sys.executable, str(ROOT / "cli.py"), "train", "--backend", "cuda", "--preset", "baseline",
        "--data-path", str(data), "--tokenizer-path", str(tokenizer), "--vocab-size", "1024",
        "--iterations", str(args.steps), "--warmup-steps", "1" if args.dry_run else "20",
        "--val-loss-every", "0", "--train-log-every", str(args.steps), "--max-wallclock-seconds", "0",
        "--out-dir", str(args.work / "runs"), "--run-id", f"pgolf_{r}",
    ]  # fmt: skip
    if args.dry_run:
        for key, value in {**DRY, "val_max_tokens": 4096, "val_batch_size": 1024}.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd, _clean_env(), args.work


def _challenge_command(args, r: int, data: Path, tokenizer: Path) -> tuple[list[str], dict, Path]:
    """The challenge's script reads its settings from the environment, and writes logs/ and its model
    files into its working folder."""
    cwd = args.work / f"challenge_{r}"
    cwd.mkdir(parents=True, exist_ok=True)
    env = _clean_env() | {
        "DATA_PATH": str(data), "TOKENIZER_PATH": str(tokenizer), "VOCAB_SIZE": "1024",
        "ITERATIONS": str(args.steps), "WARMUP_STEPS": "20", "VAL_LOSS_EVERY": "0",
        "TRAIN_LOG_EVERY": str(args.steps), "MAX_WALLCLOCK_SECONDS": "0", "RUN_ID": f"challenge_{r}",
        "SEED": "1337",
    }  # fmt: skip
    return [sys.executable, str(Path(args.challenge_script).resolve())], env, cwd


def _clean_env() -> dict:
    """This environment without the settings either trainer would read from it (pgolf reads upstream's
    names): both sides get exactly what the check gives them."""
    from dataclasses import fields

    from core.config.fields import Config

    names = {f.name.upper() for f in fields(Config)} | {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
    return {k: v for k, v in os.environ.items() if k not in names and not k.startswith("PGOLF_")}


def _timed_run(cmd: list[str], env: dict, cwd: Path, args, name: str) -> dict:
    run = _run(cmd, env, cwd, args, name)
    text = "\n".join(run["tail"])
    steps = STEP_LINE.findall(text)
    out: dict = {"seconds": run["seconds"], "log": run["log"]}
    if run["returncode"] != 0 or not steps:  # (the figures of a run that ended badly are still kept)
        why = "no step line" if run["returncode"] == 0 else _ending(run)
        out["error"] = f"{why}: {_last_line(run['tail'])}"
    if not steps:
        return out
    step, _, ms = steps[-1]
    tokens = DRY["train_batch_tokens"] if args.dry_run else 524_288
    out.update(step=int(step), ms_per_step=float(ms), tokens_per_step=tokens)
    peak = PEAK_LINE.findall(text)
    out["peak_memory_mib"] = int(peak[-1]) if peak else None
    final = ROUNDTRIP_LINE.findall(text)
    out["val_bpb"] = float(final[-1][1]) if final else None
    return out


def _run(cmd: list[str], env: dict | None, cwd: Path, args, name: str) -> dict:
    """A command in a session of its own, killed with its children at the part's deadline; its output
    goes to work/<name>.log, and the last lines come back."""
    log = args.work / f"{name}.log"
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(1.0, args.deadline - time.time()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = "timed out"
        except BaseException:  # Ctrl-C: its own session does not get the signal, so it goes here
            _kill(proc)
            raise
    tail = log.read_text(errors="replace").splitlines()[-400:]
    timed_out = code == "timed out"
    return {
        "returncode": -1 if timed_out else code,
        "timed_out": timed_out,
        "tail": tail,
        "seconds": round(time.time() - t0, 1),
        "log": str(log),
    }


def _ending(run: dict) -> str:
    return "timed out" if run["timed_out"] else f"exit {run['returncode']}"


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _cuda_test_files() -> list[str]:
    """The test files that mark any test `cuda`: collecting only them saves importing the others."""
    return sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.cuda" in p.read_text()
    )


def _collected(lines: list[str]) -> int:
    for line in reversed(lines):
        found = re.search(r"(\d+)(?:/\d+)? tests? collected", line) or re.search(r"(\d+) selected", line)
        if found:
            return int(found.group(1))
    return 0


def _junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    keys = ("tests", "failures", "errors", "skipped", "time")
    return (
        {}
        if suite is None
        else {k: float(suite.get(k, 0)) if k == "time" else int(suite.get(k, 0)) for k in keys}
    )


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]


def _last_line(lines: list[str]) -> str:
    return next((line.strip()[:300] for line in reversed(lines) if line.strip()), "(no output)")


# --------------------------------------------------------------------------------------- running them
def child(args: argparse.Namespace) -> NoReturn:
    """One part, in this process: its result (or why it failed or was skipped) as JSON on the last line
    of stdout, anything else on stderr (the log). The process then ends at once, its modules not torn
    down (PyTorch's compiler: 1-2 s of CPU, docs/performance.md)."""
    functions = {name: globals()[f"part_{name}"] for name in PARTS}
    try:
        result = {"status": "ok", **functions[args.part](args)}
    except Skip as why:
        result = {"status": "skipped", "summary": str(why)}
    except PartFailed as failure:
        result = {"status": "failed", **failure.result}
    except Exception as error:
        traceback.print_exc()  # to the log; the report gets one line
        result = {"status": "failed", "summary": f"{type(error).__name__}: {_first_line(str(error))}"}
    print("\nRESULT " + json.dumps(result, default=str), flush=True)
    sys.stderr.flush()
    os._exit(0)


def run_part(name: str, args: argparse.Namespace, argv: list[str], started: float) -> dict:
    gpu_seconds, cpu_seconds = PARTS[name]
    left = args.budget - (time.time() - started)
    if left < MIN_PART_SECONDS:
        return {
            "status": "skipped",
            "summary": f"out of time: {left:.0f} s of the {args.budget:.0f} s budget left",
        }
    limit = min(cpu_seconds if args.dry_run else gpu_seconds, left)
    deadline = time.time() + limit
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--part", name, "--deadline", str(deadline)]
    run = _run(cmd, None, ROOT, argparse.Namespace(work=args.work, deadline=deadline + 5), f"part_{name}")
    lines = run["tail"]
    result_line = next((line for line in reversed(lines) if line.startswith("RESULT ")), None)
    if result_line is None:
        why = f"{_ending(run)} after {run['seconds']:.0f} s"
        result = {"status": "failed", "summary": f"{why}: {_last_line(lines)}"}
    else:
        result = json.loads(result_line[len("RESULT ") :])
    return {**result, "seconds": run["seconds"], "limit_seconds": round(limit), "log": run["log"]}


def report_markdown(report: dict) -> str:
    lines = [
        f"# pgolf GPU check{' (dry run)' if report['dry_run'] else ''}",
        "",
        f"{report['machine']}; started {report['started']} UTC; {report['seconds']:.0f} s in all.",
        "",
        "| part | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for name, part in report["parts"].items():
        summary = str(part.get("summary", "")).replace("|", "\\|")
        lines.append(f"| {name} | {part['status']} | {part.get('seconds', 0):.0f} | {summary} |")
    lines += [
        "",
        "The figures of each part are in gpu_check.json; each part's output is in gpu_check.log.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _arguments(argv)
    if args.part:
        return child(args)
    only = [p for p in args.only.split(",") if p]
    for folder in (args.out, args.work):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(f"error: cannot make the folder {folder}: {error.strerror}", file=sys.stderr)
            return 1
    started = time.time()
    parts: dict[str, dict] = {}
    stopped = 0
    for name in PARTS:
        if only and name not in only:
            continue
        print(f"[{time.time() - started:5.0f} s] {name} ...", flush=True)
        try:
            parts[name] = run_part(name, args, argv, started)
        except KeyboardInterrupt:  # what ran so far is still reported
            parts[name] = {"status": "failed", "summary": "interrupted (Ctrl-C)"}
            stopped = 130
            break
        print(
            f"[{time.time() - started:5.0f} s] {name}: {parts[name]['status']}: {parts[name].get('summary')}",
            flush=True,
        )
    env = parts.get("env", {})
    machine = env.get("gpu") or f"CPU ({platform.machine()})"
    report = {
        "machine": f"{machine}, torch {env.get('torch', '?')}",
        "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "parts": parts,
    }
    write_atomic(args.out / "gpu_check.json", (json.dumps(report, indent=2, default=str) + "\n").encode())
    write_atomic(args.out / "gpu_check.md", report_markdown(report).encode())
    logs = [Path(part["log"]) for part in parts.values() if part.get("log")]  # then the runs' own logs
    logs += sorted(set(args.work.glob("*.log")) - set(logs))
    combined = "".join(
        f"===== {log.name}\n{log.read_text(errors='replace')}\n" for log in logs if log.is_file()
    )
    write_atomic(args.out / "gpu_check.log", combined.encode())
    failed = [name for name, part in parts.items() if part["status"] == "failed"]
    print(
        f"wrote {args.out / 'gpu_check.json'} and gpu_check.md; "
        + (f"failed: {', '.join(failed)}" if failed else "no part failed")
    )
    return stopped or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
