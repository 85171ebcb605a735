"""Document-masked attention through FlashAttention's varlen kernel, on CUDA (a module of its own: only
runs with varlen_attn_enabled use it; see FEATURES in core/config/features.py)."""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # names for annotations alone
    from collections.abc import Callable


@cache
def flash_varlen() -> Callable | None:
    """FlashAttention's varlen kernel (version 3's interface, else version 2's), if installed."""
    for module in ("flash_attn_interface", "flash_attn"):
        try:
            return importlib.import_module(module).flash_attn_varlen_func
        except (ImportError, AttributeError):
            continue
    return None


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, lower: Tensor) -> Tensor:
    """Segment-causal attention through FlashAttention's varlen kernel, S == T: every row's segments
    (where lower[b, t] == t) laid end to end as the kernel's sequences. Their boundaries have a
    data-dependent count, so this runs eagerly only (the caller checks)."""
    b, h, t, d = q.shape
    flat = lower + torch.arange(b, device=q.device)[:, None] * t  # segment starts as flat positions
    starts = torch.arange(b * t, device=q.device)[flat.flatten() == torch.arange(b * t, device=q.device)]
    cu = torch.cat([starts, starts.new_tensor([b * t])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    y = flash_varlen()(
        *(a.transpose(1, 2).reshape(b * t, a.size(1), d) for a in (q, k, v)),
        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True,
    )  # fmt: skip
    y = y[0] if isinstance(y, tuple) else y  # version 3 may return (out, lse)
    return y.reshape(b, t, h, d).transpose(1, 2)
