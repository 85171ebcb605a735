"""What the golden scripts share to run a record's own code here: the git blob id a record's file is
checked by, a script imported from its path, FlashAttention's interface on PyTorch SDPA (a CPU has no
FlashAttention) installed as the `flash_attn_interface` module, and a function defined inside another
one lifted out, closed over given values. The scripts import it from their own folder; tests import it
as tests.golden.record_code."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (`git hash-object`): how a record's file is checked."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def module_from_file(path: str | Path, name: str, blob: str | None = None) -> types.ModuleType:
    """The script at `path` imported as module `name`; a warning on stderr when its git blob is not `blob`."""
    data = Path(path).read_bytes()
    if blob is not None and git_blob_id(data) != blob:
        print(f"warning: {path} is git blob {git_blob_id(data)}, expected {blob}", file=sys.stderr)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stub_flash_attn(**functions: Callable) -> None:
    """A `flash_attn_interface` module holding `functions` (e.g. flash_attn_func=...), for the records'
    `from flash_attn_interface import ...`."""
    module = types.ModuleType("flash_attn_interface")
    for name, fn in functions.items():
        setattr(module, name, fn)
    sys.modules["flash_attn_interface"] = module


def nested(outer: types.FunctionType, name: str, **free) -> types.FunctionType:
    """The function `name` defined inside `outer` (a record's train_model, a script's main), closed over
    the values `free` gives its free variables, its globals `outer`'s."""
    code = next(c for c in outer.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == name)
    cells = tuple(types.CellType(free[v]) for v in code.co_freevars)
    return types.FunctionType(code, outer.__globals__, name, None, cells)


# ------------------------------------------------------ FlashAttention's interface on PyTorch SDPA
def flash_attn_func_sdpa(q, k, v, causal=True, **kwargs):
    """FlashAttention-3's (B, T, H, D) interface on top of PyTorch SDPA."""
    if not causal or kwargs:
        raise NotImplementedError(f"stub supports causal=True only, got causal={causal} {kwargs}")
    y = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return y.transpose(1, 2)


def flash_attn_varlen_func_sdpa(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=True,
    window_size=(-1, -1),
    **kwargs,
):
    """FlashAttention's varlen interface on packed (N, H, D) rows: every sequence cu[i]..cu[i+1] on its own,
    causal, through PyTorch SDPA with grouped kv heads; nothing crosses a boundary."""
    if not causal or tuple(window_size) != (-1, -1) or kwargs or not torch.equal(cu_seqlens_q, cu_seqlens_k):
        raise NotImplementedError(
            f"stub supports one causal cu_seqlens only, got {causal} {window_size} {kwargs}"
        )
    bounds = cu_seqlens_q.tolist()
    pieces = []
    for start, end in itertools.pairwise(bounds):
        if end > start:
            one = [a[start:end].transpose(0, 1)[None] for a in (q, k, v)]  # (1, H, L, D)
            assert end - start <= max_seqlen_q
            y = F.scaled_dot_product_attention(*one, is_causal=True, enable_gqa=True)
            pieces.append(y[0].transpose(0, 1))
    return torch.cat(pieces)
