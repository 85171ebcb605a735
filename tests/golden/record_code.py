"""What the golden scripts share to run a record's own code here: the records' files (`RECORDS`) and the git
blob id each is checked by, a record imported from $RECORD_<key> (`load_record`: unwrapped, its environment
set, torch.compile an identity, triton stubbed) or any script from its path, FlashAttention's interface on PyTorch SDPA (a CPU has no
FlashAttention) installed as the `flash_attn_interface` module, and a function defined inside another
one lifted out, closed over given values. The scripts import it from their own folder; tests import it
as tests.golden.record_code."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import itertools
import os
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

# The records' folders at the mirror's commit, with their train_gpt.py's git blob ids; scripts add theirs.
MIRROR_COMMIT = "4908dc46f21ed3fdd08d2fdca285deb2194b9599"
RECORD_DIR = "records/track_10min_16mb"
RECORDS = {
    "0329": ("2026-03-29_Loader_FullGPTQ_XSA11_BigramHash2816", "b51839cdd9bf56d62a17d43e9c9c8bb7cf2b2e86"),
    "0331": ("2026-03-31_ParallelResiduals_MiniDepthRecurrence", "ab11274f7bac65fabea0a66c42527c0a987d25e9"),
    "0404": (
        "2026-04-04_SP4096_DepthRecurrence_ParallelResid_MuonEqR",
        "69b28c1f245387c5d00d25906f243a4e472fa090",
    ),
    "0423": (
        "2026-04-23_SP8192_CaseOps_SparseGate_QuantGate_Loop45_PhasedTTT_PolarNS_MinLR_FusedCE",
        "a93c9ba9355bf07fd3a56ae251d2068013957de6",
    ),
}
OPTIONAL = {"0331"}


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


# ------------------------------------------------------ a record's train_gpt.py run here
def _unavailable(what):
    def fail(*args, **kwargs):
        raise NotImplementedError(f"{what} is a stub in tests/golden/record_code.py")

    return fail


def install_stubs() -> None:
    import torch._dynamo  # noqa: F401  (before any stub: torch probes for triton when it loads this)

    stub_flash_attn(flash_attn_func=flash_attn_func_sdpa, flash_attn_varlen_func=flash_attn_varlen_func_sdpa)

    if "brotli" not in sys.modules:
        try:
            import brotli  # noqa: F401
        except ImportError:
            br = types.ModuleType("brotli")
            br.compress = br.decompress = _unavailable("brotli")
            sys.modules["brotli"] = br


@contextlib.contextmanager
def triton_stub():
    """A stand-in for triton while a record is imported, removed after so torch never sees it.

    Its kernels are never called here; where triton is installed it is used as it is."""
    if importlib.util.find_spec("triton") is not None:
        yield
        return
    triton = types.ModuleType("triton")
    triton.jit = lambda fn=None, **kwargs: fn if fn is not None else (lambda f: f)
    triton.cdiv = lambda a, b: -(-a // b)
    language = types.ModuleType("triton.language")
    language.constexpr = type("constexpr", (), {})  # only read in kernel signatures
    tools = types.ModuleType("triton.tools")
    descriptor = types.ModuleType("triton.tools.tensor_descriptor")
    descriptor.TensorDescriptor = type("TensorDescriptor", (), {})
    triton.language, triton.tools, tools.tensor_descriptor = language, tools, descriptor
    stubs = {"triton": triton, "triton.language": language, "triton.tools": tools,
             "triton.tools.tensor_descriptor": descriptor}  # fmt: skip
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name in stubs:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def compile_is_identity():
    original = torch.compile

    def identity(fn=None, *args, **kwargs):
        return fn if fn is not None else (lambda f: f)

    torch.compile = identity
    try:
        yield
    finally:
        torch.compile = original


class _TorchWithoutBf16:
    """torch, except that torch.bfloat16 is torch.float32."""

    bfloat16 = torch.float32

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def float32_for_bfloat16(module):
    """Run a record's bfloat16 casts in float32 (substitution 5 of the docstring)."""
    original_method = torch.Tensor.bfloat16

    def to_float32_copy(self, memory_format=torch.preserve_format):
        return self.to(dtype=torch.float32, memory_format=memory_format, copy=True)

    torch.Tensor.bfloat16 = to_float32_copy
    module.torch = _TorchWithoutBf16()
    try:
        yield
    finally:
        torch.Tensor.bfloat16 = original_method
        module.torch = torch


# ------------------------------------------------------------------------------- loading records
def unwrap(text: str, path: str) -> str:
    """Source of a record; a self-extracting wrapper is run with exec bound to a collector."""
    tree = ast.parse(text)
    top_exec = any(
        isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", "") == "exec"
        for n in tree.body
    )
    if not top_exec:
        return text
    kept: list = []
    exec(
        compile(text, path, "exec"),
        {"__name__": "record_wrapper", "exec": lambda code, *a: kept.append(code)},
    )
    (code,) = kept
    return code.decode() if isinstance(code, bytes) else code


@contextlib.contextmanager
def record_environment(source: str, values: dict[str, str]):
    """Every variable the record reads is unset except those in values."""
    read = set(re.findall(r"""environ\.get\(\s*['"]([A-Z0-9_]+)['"]""", source))
    saved = dict(os.environ)
    for name in read | {"RANK", "WORLD_SIZE", "LOCAL_RANK"}:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def load_record(key: str, env: dict[str, str]):
    """Import record `key` from $RECORD_<key> with env; None if optional and not given."""
    var = f"RECORD_{key}"
    if var not in os.environ:
        if key in OPTIONAL:
            return None
        raise SystemExit(f"{var} is not set; see the docstring for the git command that extracts it")
    path = os.environ[var]
    data = Path(path).read_bytes()
    folder, blob = RECORDS[key]
    if git_blob_id(data) != blob:
        raise SystemExit(f"{path} is not {RECORD_DIR}/{folder}/train_gpt.py at {MIRROR_COMMIT} (blob {blob})")
    source = unwrap(data.decode("utf-8"), path)
    module = types.ModuleType(f"record_{key}")
    module.__file__ = path
    module.source = source
    sys.modules[module.__name__] = module
    with record_environment(source, env), compile_is_identity(), triton_stub():
        exec(compile(source, path, "exec"), module.__dict__)
    return module


def nested_functions(module, outer: str, names: tuple[str, ...], free: dict) -> dict:
    """Functions defined inside `outer` in the record's source, with their free variables bound."""
    tree = ast.parse(module.source)
    outer_def = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == outer)
    defs = [n for n in outer_def.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(d.name for d in defs) == sorted(names), [d.name for d in defs]
    namespace = dict(free)
    exec(compile(ast.Module(body=defs, type_ignores=[]), module.__file__, "exec"), namespace)
    return {name: namespace[name] for name in names}
