"""The PyTorch backend: what core.train.loop needs to train pgolf's GPT on CUDA GPUs or a CPU.

Launched as a plain process it uses one device; under `torchrun` it joins the
process group (NCCL on CUDA, gloo on CPU) and wraps the compiled model in DDP.
The plain module is kept for parameters and state, so nothing saved ever
carries a compile or DDP prefix. A rank that fails leaves without waiting for the
others (`close`); collectives time out after `collective_timeout_seconds`.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from core.common.errors import PgolfError, first_line
from core.common.launch import launch, reach_rank_0, rendezvous_failed
from core.model.params import check_layout, head_weight_name, param_specs, storage_dtypes
from cuda_train.model import GPT, CastedLinear, maybe_compile
from cuda_train.optim import Muon, build_optimizers
from cuda_train.ttt import TorchTTT

if TYPE_CHECKING:  # names for annotations alone
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from core.config.fields import Config

# Dense bf16 tensor-core peaks from NVIDIA's datasheets, by the exact name torch.cuda reports:
# the PCIe and NVL cards of a generation are slower than its SXM one (a substring would mix them).
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,  # SXM
    "NVIDIA H200 NVL": 835e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
}
FAILURE_KEY = "pgolf/first_failed_rank"  # in the process group's store: who failed first


def peak_bf16_flops(device_name: str) -> float | None:
    """The datasheet peak of a GPU by its torch.cuda name; None for a card not in the table (no MFU)."""
    return PEAK_BF16_FLOPS.get(device_name.strip())


def state_keys(opt: torch.optim.Optimizer) -> tuple[str, ...]:
    """What the canonical optimizer state (core.model.backend) holds of an optimizer, per parameter."""
    return ("momentum_buffer",) if isinstance(opt, Muon) else ("exp_avg", "exp_avg_sq")


def check_config(cfg: Config) -> None:
    """PyTorch reads no option of its own: the shared checks of Config.validate are all."""


class TorchBackend:
    name = "cuda"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.specs = param_specs(cfg)
        place = launch()  # torchrun's settings, checked (the CLI and a packaged script checked them first)
        self.world_size, self.rank, local_rank = place.world_size, place.rank, place.local_rank
        cuda = torch.cuda.is_available()
        self.torch_device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        self.device, name = "cpu", ""
        if cuda:
            torch.cuda.set_device(self.torch_device)
            name = torch.cuda.get_device_name(self.torch_device)
            self.device = f"cuda:{local_rank} ({name})"
        if self.world_size > 1 and not dist.is_initialized():
            # A short timeout: a rank that hangs fails the job in minutes, not torch's 10 (NCCL) or 30 (gloo).
            timeout = cfg.collective_timeout_seconds
            reach_rank_0(place, timeout)
            try:
                dist.init_process_group(
                    "nccl" if cuda else "gloo",
                    device_id=self.torch_device if cuda else None,
                    timeout=timedelta(seconds=timeout) if timeout > 0 else None,
                )
            except RuntimeError as exc:  # the store's DistStoreError or DistNetworkError: a rank never came
                raise rendezvous_failed(place, timeout, str(exc)) from None
        self.bf16 = cfg.uses_bf16(cuda)
        if cuda:  # TF32 for the fp32 matmuls left outside autocast; float32 asked for means float32
            torch.backends.cuda.matmul.allow_tf32 = self.bf16
            torch.backends.cudnn.allow_tf32 = self.bf16
        self.peak_flops = peak_bf16_flops(name) if self.bf16 else None
        torch.manual_seed(cfg.seed)

        self.model = GPT(cfg).to(self.torch_device)  # built from the parameter table, by its names and shapes
        for pname, dtype in storage_dtypes(cfg, self.bf16).items():
            p = self.model.get_parameter(pname)
            p.data = p.data.to(getattr(torch, dtype))  # torch.float32 or torch.bfloat16
        compile_on = self.compile_on = cfg.uses_compile(cuda)
        # The moving average of the weights, in fp32 on the device (core.model.backend's "ema/<name>").
        # load_params starts it at the loaded weights; load_optimizer_state restores a saved one.
        self.ema = (
            {n: torch.zeros(s.shape, device=self.torch_device) for n, s in self.specs.items()}
            if cfg.ema_decay > 0
            else {}
        )
        self.steps_taken = 0
        self._counters: dict[str, int] = {}  # counter_add's, in one process
        self.looping = cfg.num_loops > 0  # passed to every forward: an argument compile guards on
        self.compiled = maybe_compile(self.model, compile_on, cfg.compile_backend)
        self._token_losses = maybe_compile(
            self.model.token_losses, compile_on, cfg.compile_backend
        )  # sliding-window evaluation's
        self.runner = self.compiled
        if self.world_size > 1:
            # An empty parameter (the skip weights of a one-layer model) never gets a gradient, which
            # DDP refuses; out of autograd it is left alone, and nothing changes for the others.
            for p in self.model.parameters():
                if p.numel() == 0:
                    p.requires_grad_(False)
            with warnings.catch_warnings():  # newer torch renames the flag; the meaning is what we want
                warnings.simplefilter("ignore", FutureWarning)
                # The only buffers are the RoPE tables, identical on every rank: never broadcast them.
                self.runner = DDP(
                    self.compiled, device_ids=[local_rank] if cuda else None, broadcast_buffers=False
                )
        self.autocast = (
            torch.autocast(device_type=self.torch_device.type, dtype=torch.bfloat16)
            if self.bf16
            else nullcontext()
        )

    @functools.cached_property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Built when first used (a training step, or their state read or restored): a process that only
        scores never builds one, nor imports torch's compiler stack, which their constructors do (~1 s)."""
        return build_optimizers(self.model, self.specs, self.cfg, self.compile_on)

    # ------------------------------------------------------------------ state
    def load_params(self, params: dict[str, np.ndarray]) -> None:
        check_layout(self.cfg, {k: np.shape(v) for k, v in params.items()}, "weights")
        with torch.no_grad():
            for name in self.specs:
                p = self.model.get_parameter(name)
                p.copy_(torch.from_numpy(np.asarray(params[name], dtype=np.float32)))  # copy_ casts
                if self.ema:
                    self.ema[name].copy_(p.float())

    def params(self) -> dict[str, np.ndarray]:
        return {name: p.detach().float().cpu().numpy().copy() for name, p in self.model.named_parameters()}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"step": np.array(self.steps_taken, dtype=np.int64)}
        names = {p: n for n, p in self.model.named_parameters()}
        for opt in self.optimizers:
            for p in opt.param_groups[0]["params"]:
                state = opt.state.get(p, {})
                for key in state_keys(opt):
                    value = state.get(key)
                    array = np.zeros(p.shape, np.float32) if value is None else value.float().cpu().numpy()
                    out[f"{key}/{names[p]}"] = array.copy()
        out.update({f"ema/{n}": e.cpu().numpy().copy() for n, e in self.ema.items()})
        return out

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        # Every key is there: the state is this backend's own (the warm-up's), or a checkpoint's that
        # core/artifact/load.py's check_resumable found complete.
        step = int(state["step"])
        with torch.no_grad():
            for n, e in self.ema.items():
                e.copy_(torch.from_numpy(np.asarray(state[f"ema/{n}"])).to(self.torch_device, torch.float32))
        for opt in self.optimizers:
            opt.state.clear()  # step 0: a fresh optimizer, torch creates its state lazily
        if step > 0:
            self._restore_optimizers(state, step)
        self.steps_taken = step

    def _restore_optimizers(self, state: dict[str, np.ndarray], step: int) -> None:
        """Each optimizer's state after `step` steps, from the canonical layout (core.model.backend) of
        `state`, which core/artifact/load.py's `check_resumable` found complete."""
        names = {p: n for n, p in self.model.named_parameters()}
        for opt in self.optimizers:
            for p in opt.param_groups[0]["params"]:
                # In the parameter's dtype: fp32 for Muon's matrices, the embedding's own for Adam.
                opt.state[p] = {
                    key: torch.from_numpy(np.asarray(state[f"{key}/{names[p]}"]))
                    .to(self.torch_device, torch.float32)
                    .to(p.dtype)
                    for key in state_keys(opt)
                }
                if not isinstance(opt, Muon):  # on the device only for the fused kernel
                    where = p.device if opt.defaults.get("fused") else "cpu"
                    opt.state[p]["step"] = torch.tensor(float(step), dtype=torch.float32, device=where)

    # --------------------------------------------------------------- compute
    def to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.torch_device, torch.int64, non_blocking=True)

    def train_step(
        self,
        micro_batches: list[tuple[np.ndarray, np.ndarray]],
        lr_mult: float,
        muon_momentum: float,
        muon_wd_mult: float = 1.0,
    ) -> torch.Tensor:
        self.model.train()
        self.model.zero_grad(set_to_none=True)  # every parameter is in one of the optimizers
        total = torch.zeros((), device=self.torch_device)
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            # DDP averages the gradients over the ranks at the last micro-batch only.
            context = self.runner.no_sync() if self.world_size > 1 and i < n - 1 else nullcontext()
            with context, self.autocast:
                loss = self.runner(self.to_device(x), self.to_device(y), looping=self.looping)
            (loss / n).backward()
            total += loss.detach()
        if self.cfg.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip_norm)
        for opt in self.optimizers:
            group = opt.param_groups[0]
            group["lr"] = group["base_lr"] * lr_mult
            if isinstance(opt, Muon):
                group["momentum"] = muon_momentum
                group["weight_decay"] = group["base_weight_decay"] * muon_wd_mult
            opt.step()
        if self.ema:
            with torch.no_grad():
                ema, live = list(self.ema.values()), [self.model.get_parameter(n).float() for n in self.ema]
                torch._foreach_mul_(ema, self.cfg.ema_decay)
                torch._foreach_add_(ema, live, alpha=1.0 - self.cfg.ema_decay)
        self.steps_taken += 1
        return total / n

    def set_looping(self, active: bool) -> None:
        self.looping = bool(active) and self.cfg.num_loops > 0

    @torch.inference_mode()
    def eval_nll(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        self.model.eval()
        with self.autocast:
            loss = self.compiled(self.to_device(x), self.to_device(y), reduction="sum", looping=self.looping)
        return loss.double()  # queued, not waited for: the caller sums on the device

    def segments_every(self, length: int) -> AbstractContextManager[None]:
        return self.model.walk.segments_every(length)

    @torch.inference_mode()
    def token_losses(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        self.model.eval()
        with self.autocast:
            nll = self._token_losses(self.to_device(x), self.to_device(y), looping=self.looping)
        return nll.float().cpu().numpy()

    @torch.inference_mode()
    def input_hessians(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}

        def add(name: str, x: torch.Tensor) -> None:
            x = x.float().reshape(-1, x.size(-1))  # (inference mode: nothing to detach)
            if name not in sums:
                sums[name] = torch.zeros(x.size(1), x.size(1), device=x.device)
            sums[name].addmm_(x.T, x)

        hooks = [
            module.register_forward_hook(
                lambda _m, inputs, _out, name=f"{prefix}.weight": add(name, inputs[0])
            )
            for prefix, module in self.model.named_modules()
            if isinstance(module, CastedLinear) and module is not self.model.lm_head
        ]
        try:
            for x, _ in batches:
                with self.autocast:
                    add(head_weight_name(self.cfg), self.model.hidden(self.to_device(x), self.looping))
        finally:
            for hook in hooks:
                hook.remove()
        return {name: h.cpu().numpy() for name, h in sums.items()}

    @torch.inference_mode()
    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 logits (B, T, V) of token ids `x` (B, T), after the softcap (parity checks: `verify`)."""
        self.model.eval()
        with self.autocast:
            return self.model.logits(self.to_device(x), self.looping).float().cpu().numpy()

    def decoder(self) -> Callable[[np.ndarray], np.ndarray]:
        """A new generation (`sample`): the next ids in, the logits after the last of them out; the keys and
        values of the ids seen are kept between calls."""
        model, cache = self.model, {}

        @torch.inference_mode()
        def next_logits(ids: np.ndarray) -> np.ndarray:
            model.eval()
            with self.autocast:
                out = model.logits(self.to_device(ids[None]), self.looping, cache)
            return out[0, -1].float().cpu().numpy()

        return next_logits

    def ttt(self) -> TorchTTT:
        return TorchTTT(self)

    def counter_add(self, key: str, amount: int) -> int:
        if self.world_size == 1:
            self._counters[key] = self._counters.get(key, 0) + amount
            return self._counters[key]
        return int(dist.distributed_c10d._get_default_store().add(key, amount))

    # ------------------------------------------------------------ plumbing
    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if self.world_size == 1:
            return values
        t = torch.from_numpy(values.copy()).to(self.torch_device)
        dist.all_reduce(t)
        return t.cpu().numpy()

    def from_rank_0(self, key: str, text: str | None, wait_seconds: float) -> str:
        """With several ranks through the process group's store, not a collective: NCCL's and gloo's timeouts
        do not apply, the other ranks wait up to `wait_seconds` (the artifact fit's settings)."""
        if self.world_size == 1:
            return text or ""
        store = dist.distributed_c10d._get_default_store()
        if self.rank == 0:
            store.set(key, text or "")
            return text or ""
        try:
            store.wait([key], timedelta(seconds=wait_seconds))
        except RuntimeError as exc:  # its timeout (DistStoreError), or the store gone
            raise PgolfError(f"no {key} from rank 0 within {wait_seconds:g} s: {first_line(exc)}") from None
        return store.get(key).decode()

    def synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def peak_memory_bytes(self) -> int | None:
        if self.torch_device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.torch_device))
        return None

    def close(self, failed: bool = False) -> int | None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if not failed:
            # Every rank leaves together, and DDP lets go of the group before it is destroyed:
            # a gloo group still referenced at interpreter exit can abort the process.
            dist.barrier()
            self.runner = self.compiled
            dist.destroy_process_group()
            return None
        # No barrier: the other ranks may be gone or waiting in a collective. Nor a destroy or an
        # abort: both wait for this rank's collectives in flight (gloo until its timeout, as tried
        # here). The process ends next (cli.py), which is what makes the others' collectives fail.
        # This rank is recorded as the job's first failure unless another was, in torchrun's store
        # (its agent's process, so it outlives the ranks); None if it does not answer within 2 s.
        self.runner = self.compiled
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set_timeout(timedelta(seconds=2))
            return int(store.compare_set(FAILURE_KEY, "", str(self.rank)))
        except Exception:  # the failure being reported matters more than this one
            return None


def create_backend(cfg: Config) -> TorchBackend:
    return TorchBackend(cfg)
