"""Training-step benchmark: tokens/s, ms/step, peak memory and MFU for any backend.

It times real optimizer steps of the configured model on random tokens (so it
needs no dataset), after untimed warm-up steps that absorb compilation.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from core.model.backend import Backend
from core.model.params import count_params, flops_per_token, init_params


@dataclass
class BenchResult:
    backend: str
    device: str
    world_size: int
    compute: str
    params: int
    tokens_per_step: int
    steps: int
    ms_per_step: float
    tokens_per_s: float
    mfu: float | None  # model FLOPs utilisation against the device's peak; None when unknown
    peak_memory_mib: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def benchmark(backend: Backend, steps: int = 10, warmup: int = 3, seed: int = 0) -> BenchResult:
    cfg = backend.cfg
    cfg.validate(backend.world_size)
    accum = cfg.local_accum_steps(backend.world_size)
    seqs = cfg.train_batch_tokens // cfg.grad_accum_steps // cfg.train_seq_len
    rng = np.random.default_rng(seed + backend.rank)
    batches = []
    for _ in range(accum):
        tokens = rng.integers(0, cfg.vocab_size, size=(seqs, cfg.train_seq_len + 1), dtype=np.int32)
        batches.append((tokens[:, :-1].copy(), tokens[:, 1:].copy()))
    backend.load_params(init_params(cfg, bf16=backend.bf16))
    for _ in range(warmup):
        float(backend.train_step(batches, 1.0, cfg.muon_momentum))
    backend.synchronize()
    t0 = time.perf_counter()
    loss = 0.0
    for _ in range(steps):
        loss = backend.train_step(batches, 1.0, cfg.muon_momentum)
    float(loss)
    backend.synchronize()
    seconds = (time.perf_counter() - t0) / max(steps, 1)
    tokens_per_s = cfg.train_batch_tokens / seconds
    peak = backend.peak_memory_bytes()
    mfu = (
        flops_per_token(cfg) * tokens_per_s / (backend.peak_flops * backend.world_size)
        if backend.peak_flops
        else None
    )
    return BenchResult(
        backend=backend.name,
        device=backend.device,
        world_size=backend.world_size,
        compute="bf16" if backend.bf16 else "fp32",
        params=count_params(cfg),
        tokens_per_step=cfg.train_batch_tokens,
        steps=steps,
        ms_per_step=1000.0 * seconds,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        peak_memory_mib=None if peak is None else peak / 2**20,
    )
