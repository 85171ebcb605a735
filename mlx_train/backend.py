"""The MLX backend: what core.train.loop needs to train pgolf's GPT on Apple silicon (or a CPU).

A step accumulates gradients over the micro-batches, each cut into sub-batches of
at most `mlx_max_microbatch_tokens` tokens so a 16 GB Mac does not run out of
memory, then applies one optimizer update. On the GPU both the gradient of a
sub-batch and the update are `mx.compile`d; the learning-rate multiplier and the
momentum enter as arrays, so changing them does not recompile. On a CPU `compile`
defaults to off: measured there, it was no faster and it undid the memory saving
of the CPU ops (mlx_train/ops.py), most likely by merging their backward-pass
recomputations with the forward pass.

Several processes (or Macs) train together through MLX's own `mx.distributed`,
started by `mlx.launch` (see docs/distributed.md): each rank reads its own share of every
batch, the gradients are averaged with one `all_sum` per tensor, and every rank
then applies the same update (Muon's orthogonalisation is computed on every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from core.common.errors import PgolfError
from core.config.fields import Config
from core.model.backend import text_by_sum
from core.model.params import check_layout, head_weight_name, param_specs, storage_dtypes
from mlx_train.model import GPT, CastedLinear
from mlx_train.optim import Optimizers
from mlx_train.ttt import MLXTTT

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def _on_gpu() -> bool:
    return mx.default_device() == mx.gpu


def check_config(cfg: Config) -> None:
    """The options only MLX reads."""
    if cfg.mlx_max_microbatch_tokens <= 0:
        raise PgolfError(
            f"config: mlx_max_microbatch_tokens must be positive, got {cfg.mlx_max_microbatch_tokens}"
        )


def sub_batches(x: np.ndarray, y: np.ndarray, max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split (B, T) batches into runs of whole sequences of at most max_tokens tokens (one sequence at least)."""
    per = max(max_tokens // x.shape[1], 1)
    return [(x[i : i + per], y[i : i + per]) for i in range(0, x.shape[0], per)]


class MLXBackend:
    name = "mlx"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.specs = param_specs(cfg)
        self.group = mx.distributed.init()  # a group of one unless started by mlx.launch
        self.rank, self.world_size = self.group.rank(), self.group.size()
        gpu = _on_gpu()
        self.bf16 = cfg.uses_bf16(gpu)
        self.device = f"gpu ({mx.device_info().get('device_name', 'Apple GPU')})" if gpu else "cpu"
        self.peak_flops = None
        self.dtypes = {k: DTYPES[v] for k, v in storage_dtypes(cfg, self.bf16).items()}
        self.model = GPT(cfg, mx.bfloat16 if self.bf16 else mx.float32)
        shapes = {k: tuple(v.shape) for k, v in tree_flatten(self.model.parameters())}
        check_layout(cfg, shapes, "the MLX model")
        self.optim = Optimizers(cfg, self.specs)
        compile_on = cfg.uses_compile(gpu)
        # A keyword argument of the compiled functions below: mx.compile keeps one trace per value
        # (passed positionally, MLX 0.32 traces a first False twice).
        self.looping = cfg.num_loops > 0
        self._counters: dict[str, int] = {}  # counter_add's

        grad_fn = nn.value_and_grad(self.model, self.model.loss)
        # value_and_grad swaps traced parameters into the model, so its state is an output too.
        model_state = [self.model.state]
        self._grad = (
            partial(mx.compile, inputs=model_state, outputs=model_state)(grad_fn) if compile_on else grad_fn
        )

        def update(grads: dict, lr_mult: mx.array, momentum: mx.array, muon_wd_mult: mx.array) -> None:
            params = dict(tree_flatten(self.model.parameters()))
            if cfg.grad_clip_norm > 0:
                norm = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for g in grads.values()))
                factor = mx.minimum(cfg.grad_clip_norm / (norm + 1e-6), 1.0)
                grads = {k: g * factor for k, g in grads.items()}
            self.model.update(
                tree_unflatten(list(self.optim.apply(params, grads, lr_mult, momentum, muon_wd_mult).items()))
            )

        state = [self.model.state, self.optim.state]
        self._update = partial(mx.compile, inputs=state, outputs=state)(update) if compile_on else update

        # float64 exists on the CPU only: on a Metal GPU the sums stay float32.
        self.sum_dtype = mx.float32 if _on_gpu() else mx.float64

        def nll_sum(x: mx.array, y: mx.array, looping: bool) -> mx.array:
            return self.model.token_losses(x, y, looping).astype(self.sum_dtype).sum()

        self._nll_sum = mx.compile(nll_sum, inputs=self.model.state) if compile_on else nll_sum

        def token_losses(x: mx.array, y: mx.array, looping: bool) -> mx.array:
            return self.model.token_losses(x, y, looping).astype(mx.float32)

        self._token_losses = mx.compile(token_losses, inputs=self.model.state) if compile_on else token_losses

    # ------------------------------------------------------------------ state
    def load_params(self, params: dict[str, np.ndarray]) -> None:
        check_layout(self.cfg, {k: np.shape(v) for k, v in params.items()}, "weights")
        arrays = [
            (k, mx.array(np.asarray(params[k], dtype=np.float32)).astype(self.dtypes[k])) for k in self.specs
        ]
        self.model.update(tree_unflatten(arrays))
        self.optim.reset_ema(dict(arrays))
        mx.eval(self.model.parameters(), self.optim.state)

    def params(self) -> dict[str, np.ndarray]:
        flat = dict(tree_flatten(self.model.parameters()))
        return {k: np.array(flat[k].astype(mx.float32)) for k in self.specs}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.optim.state.items()}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        # Every key is there: the state is this backend's own (the warm-up's), or a checkpoint's that
        # core/artifact/load.py's check_resumable found complete.
        for key, current in list(self.optim.state.items()):
            self.optim.state[key] = (
                mx.array(np.asarray(state[key])).astype(current.dtype).reshape(current.shape)
            )
        mx.eval(self.optim.state)

    # --------------------------------------------------------------- compute
    def train_step(
        self,
        micro_batches: list[tuple[np.ndarray, np.ndarray]],
        lr_mult: float,
        muon_momentum: float,
        muon_wd_mult: float = 1.0,
    ) -> mx.array:
        total = sum(x.size for x, _ in micro_batches)
        grads: dict[str, mx.array] | None = None
        loss = mx.array(0.0, dtype=mx.float32)
        for mx_, my_ in micro_batches:
            for x, y in sub_batches(mx_, my_, self.cfg.mlx_max_microbatch_tokens):
                weight = x.size / total  # sub-batch share of the step's tokens
                value, tree = self._grad(mx.array(x), mx.array(y), looping=self.looping)
                flat = dict(tree_flatten(tree))
                if grads is None:
                    grads = {k: g * weight for k, g in flat.items()}
                else:
                    grads = {k: grads[k] + g * weight for k, g in flat.items()}
                loss = loss + value * weight
                if self.cfg.mlx_eager_eval:
                    mx.eval(grads, loss)  # keep the lazy graph from growing across sub-batches
        assert grads is not None, "train_step needs at least one micro-batch"
        if self.world_size > 1:
            grads = {
                k: mx.distributed.all_sum(g, group=self.group) / self.world_size for k, g in grads.items()
            }
        self._update(
            grads,
            mx.array(lr_mult, dtype=mx.float32),
            mx.array(muon_momentum, dtype=mx.float32),
            mx.array(muon_wd_mult, dtype=mx.float32),
        )
        mx.eval(self.model.state, self.optim.state, loss)
        return loss

    def set_looping(self, active: bool) -> None:
        self.looping = bool(active) and self.cfg.num_loops > 0

    def eval_nll(self, x: np.ndarray, y: np.ndarray) -> mx.array:
        total = mx.array(0.0, dtype=self.sum_dtype)
        for xs, ys in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens):
            total = total + self._nll_sum(mx.array(xs), mx.array(ys), looping=self.looping)
        mx.async_eval(total)  # started, not waited for; and the caller's lazy sum stays short
        return total

    def segments_every(self, length: int) -> AbstractContextManager[None]:
        return self.model.walk.segments_every(length)

    def token_losses(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        parts = [
            np.array(self._token_losses(mx.array(xs), mx.array(ys), looping=self.looping))
            for xs, ys in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens)
        ]
        return np.concatenate(parts)

    def input_hessians(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        sums: dict[str, mx.array] = {}

        def add(name: str, x: mx.array) -> None:
            x = x.astype(mx.float32).reshape(-1, x.shape[-1])
            gram = x.T @ x
            sums[name] = sums[name] + gram if name in sums else gram

        linears = [
            (prefix, module)
            for prefix, module in self.model.named_modules()
            if isinstance(module, CastedLinear) and prefix != "lm_head"
        ]
        for prefix, module in linears:
            module.on_input = partial(add, f"{prefix}.weight")
        head = head_weight_name(self.cfg)
        try:
            for x, y in batches:
                for xs, _ in sub_batches(x, y, self.cfg.mlx_max_microbatch_tokens):
                    add(head, self.model.hidden(mx.array(xs), self.looping))
                    mx.eval(sums)
        finally:
            for _, module in linears:
                module.on_input = None
        return {name: np.array(h) for name, h in sums.items()}

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.array(self.model.logits(mx.array(x), self.looping).astype(mx.float32))

    def decoder(self) -> Callable[[np.ndarray], np.ndarray]:
        model, cache = self.model, {}

        def next_logits(ids: np.ndarray) -> np.ndarray:
            logits = model.decode(mx.array(ids[None]), cache, self.looping)
            return np.array(logits[0, -1].astype(mx.float32))

        return next_logits

    def ttt(self) -> MLXTTT:
        return MLXTTT(self)

    def counter_add(self, key: str, amount: int) -> int:
        # No store is shared between MLX processes: the ranks take turns instead (rank r gets every
        # world_size-th value), which is the same as sharing a counter when each call adds 1.
        calls = self._counters[key] = self._counters.get(key, 0) + 1
        if amount != 1 and self.world_size > 1:
            raise PgolfError("MLX ranks share a counter only one at a time")
        return (calls - 1) * self.world_size * amount + (self.rank + 1) * amount

    # ------------------------------------------------------------ plumbing
    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if self.world_size == 1:
            return values
        # float64 exists on the CPU stream only; the sums (bytes, nats) need its precision.
        return np.array(mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu))

    def from_rank_0(self, key: str, text: str | None, wait_seconds: float) -> str:
        if self.world_size == 1:
            return text or ""
        # No store is shared between MLX processes; its collectives wait without a timeout.
        return text_by_sum(self.all_reduce_sum, self.rank, text)

    def synchronize(self) -> None:
        mx.synchronize()

    def peak_memory_bytes(self) -> int | None:
        return int(mx.get_peak_memory())  # Metal or CPU allocator: MLX tracks both

    def close(self, failed: bool = False) -> int | None:
        return None  # mx.distributed keeps nothing to release; it cannot tell who failed first


def create_backend(cfg: Config) -> MLXBackend:
    return MLXBackend(cfg)
