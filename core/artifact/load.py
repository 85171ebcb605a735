"""Any file of weights read back, trusting nothing: checkpoints, artifacts of every format, and the
config that fits them. (A training run reads none of these but the weights it starts from, with
`init_from`: it writes its checkpoints and reads back its own artifact alone, core/artifact/export.py;
resuming one is the CLI's.)

- Checkpoints (core/artifact/checkpoint.py's format): checked against their sha256 and the types
  the loop relies on (`load_checkpoint`), or only their config read from the header
  (`checkpoint_config`); `check_resumable` says whether a config can go on from one, and
  `restore_data_position` puts a training loader back where the checkpoint's was.
- Artifacts (`read_artifact`; `load_mixed_artifact` for the mixed format alone): pgolf's container in either format, the challenge's torch int8
  container (zlib), its MLX pickle when allowed, and the records' int6 `final_model.int6.ptz`.
- `saved_config`: the settings a file of weights was trained and scored with, where it keeps them;
  `config_for_params`: a config with the model shape read off the tensors; `load_weights`: either
  kind of file as float32 arrays and the config they fit.
- Initial weights (`load_init_weights`, the `init_from` setting): a checkpoint's parameters, a
  safetensors file of weights or a torch state dict, under pgolf's names or the records'
  (`record_names_to_pgolf`: their banks split into per-layer matrices), checked against the config.
"""

from __future__ import annotations

import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load

from core.artifact import container
from core.artifact.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    Checkpoint,
    checkpoint_digest,
    tensors_digest,
)
from core.artifact.checks import check_container, check_finite, check_mixed, check_model, is_container
from core.artifact.container import open_any
from core.artifact.export import dequantize, from_container
from core.artifact.mixed import MIXED_FORMAT, MixedModel, mixed_from_container
from core.artifact.quantized import Int8Model
from core.artifact.records import load_record_artifact, record_compressor
from core.artifact.upstream import load_artifact
from core.common.errors import PgolfError, first_line
from core.common.files import file_sha256, open_regular, parse_json, read_file
from core.config.fields import MAX_LAYERS, Config
from core.config.sources import read_run_config
from core.data.coprime import CoprimeLoader
from core.data.sequential import BatchLoader, TokenStream
from core.data.shards import read_shard
from core.model.optim import optimizer_state_shapes
from core.model.params import check_layout

MAX_CHECKPOINT_BYTES = 2**36  # 64 GiB: a checkpoint is read whole into memory


# ----------------------------------------------------------------- checkpoints
def is_checkpoint(path: str | Path) -> bool:
    """Cheap sniff: a `.safetensors` file (what a damaged checkpoint is still called), or a
    safetensors header whose metadata names our checkpoint format."""
    return Path(path).suffix == ".safetensors" or names_checkpoint_format(path)


def names_checkpoint_format(path: str | Path) -> bool:
    """The file's safetensors header names our checkpoint format (whatever the file is called)."""
    try:
        with open_regular(path, "checkpoint") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            n = int.from_bytes(head, "little")
            return n < 100_000_000 and CHECKPOINT_FORMAT.encode() in f.read(min(n, 1_000_000))
    except (OSError, PgolfError):
        return False


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    blob = read_file(path, "checkpoint", MAX_CHECKPOINT_BYTES)
    if len(blob) < 9:
        raise PgolfError(f"checkpoint {path}: only {len(blob)} bytes: truncated, or not a checkpoint")
    try:
        if blob[8:9] != b"{":  # a safetensors header is JSON: its first byte is "{"
            raise ValueError("not safetensors")
        n = int.from_bytes(blob[:8], "little")
        header = parse_json(blob[8 : 8 + n], f"checkpoint {path}: its header") if len(blob) >= 8 + n else None
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] if header else []
        if header is None or len(blob) < 8 + n + max(ends, default=0):
            raise PgolfError(
                f"checkpoint {path}: truncated ({len(blob):,} bytes, fewer than its header promises)"
            )
        tensors = st_load(blob)
        meta = parse_json(header["__metadata__"]["pgolf"], f"checkpoint {path}: its metadata")
    except (SafetensorError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint (corrupt or wrong file)") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint")
    version = meta.get("version")
    if version not in (1, CHECKPOINT_VERSION):
        raise PgolfError(f"checkpoint {path}: unsupported version {version}")
    if "sha256" not in meta:
        raise PgolfError(f"checkpoint {path}: has no checksum (damaged, or written before pgolf wrote one)")
    expected = tensors_digest(tensors) if version == 1 else checkpoint_digest(tensors, meta)
    if meta["sha256"] != expected:
        raise PgolfError(f"checkpoint {path}: its content does not match its checksum (the file is damaged)")
    if version == 1:
        warnings.warn(
            f"checkpoint {path} was written before checkpoints covered their step, clock and data "
            "position with their checksum: only its tensors are checked",
            stacklevel=2,
        )
    _check_metadata(meta, path)
    try:
        check_finite(tensors)
    except ValueError as exc:
        raise PgolfError(f"checkpoint {path}: {exc}") from None
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    optimizer = {k.removeprefix("opt/"): v for k, v in tensors.items() if k.startswith("opt/")}
    return Checkpoint(
        params=params,
        optimizer=optimizer,
        config=meta["config"],
        step=int(meta["step"]),
        train_time_ms=float(meta["train_time_ms"]),
        data_state=meta.get("data_state", {}),
        backend=meta.get("backend", ""),
        dtypes=meta.get("dtypes", {}),
    )


def checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The config a checkpoint was trained with, from its header alone (the tensors are not read)."""
    path = Path(path)
    with open_regular(path, "checkpoint") as f:  # a FIFO, a device, a folder: refused by name
        try:
            head = f.read(8)
            body = f.read(min(int.from_bytes(head.ljust(8, b"\0"), "little"), 100_000_000))
        except OSError as exc:
            raise PgolfError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    return _metadata(head, body, path)["config"]


def _metadata(head: bytes, rest: bytes, path: Path) -> dict[str, Any]:
    """The checked pgolf metadata of a checkpoint: its first 8 bytes, then at least its header."""
    try:
        n = int.from_bytes(head, "little")
        if len(head) < 8 or len(rest) < n:
            raise ValueError("short")
        header = parse_json(rest[:n], f"checkpoint {path}: its header")
        meta = parse_json(header["__metadata__"]["pgolf"], f"checkpoint {path}: its metadata")
    except (ValueError, KeyError, TypeError):
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint (corrupt or wrong file)") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint")
    if meta.get("version") not in (1, CHECKPOINT_VERSION):
        raise PgolfError(f"checkpoint {path}: unsupported version {meta.get('version')}")
    _check_metadata(meta, path)
    return meta


def _check_metadata(meta: dict[str, Any], path: Path) -> None:
    """Each metadata field has the type the loop relies on, or the file is refused by name."""
    expected = {
        "config": (dict, "an object"),
        "step": (int, "a whole number >= 0"),
        "train_time_ms": ((int, float), "a number >= 0"),
        "data_state": (dict, "an object"),
        "backend": (str, "a string"),
        "dtypes": (dict, "an object"),
    }
    optional = ("data_state", "backend", "dtypes")  # written by every version, not needed to resume
    for key, (kind, wanted) in expected.items():
        if key in optional and key not in meta:
            continue
        value = meta.get(key)
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and key in ("step", "train_time_ms"):
            ok = 0 <= value < float("inf")
        if not ok:
            raise PgolfError(f"checkpoint {path}: metadata {key!r} must be {wanted}, got {value!r}")


def check_resumable(cfg: Config, ckpt: Checkpoint, path: str | Path) -> None:
    """A run of `cfg` can resume from the checkpoint: it holds every parameter and optimizer tensor
    the config needs, in its shape."""
    check_layout(cfg, {k: tuple(v.shape) for k, v in ckpt.params.items()}, f"checkpoint {path}")
    for name, shape in optimizer_state_shapes(cfg).items():
        got = ckpt.optimizer.get(name)
        if got is None or tuple(got.shape) != shape:
            found = "missing" if got is None else f"shape {tuple(got.shape)}"
            raise PgolfError(
                f"checkpoint {path}: optimizer state {name} is {found}, but the config expects {shape}"
            )
    step = ckpt.optimizer["step"]
    if step.dtype.kind not in "iu" or int(step) < 0:
        raise PgolfError(f"checkpoint {path}: optimizer step must be a whole number >= 0, got {step}")


def restore_data_position(loader: BatchLoader | CoprimeLoader | TokenStream, state: Any) -> None:
    """Put a training loader back where `loader.state()` was taken (a checkpoint's `data_state`),
    after checking that the saved position fits these shards; PgolfError naming the first problem."""
    if isinstance(loader, CoprimeLoader):
        _restore_coprime(loader, state)
    else:
        _restore_stream(loader.stream if isinstance(loader, BatchLoader) else loader, state)


def _restore_stream(stream: TokenStream, state: Any) -> None:
    """A `TokenStream.state()` back into `stream`."""
    try:
        index, position, epoch = int(state["file_index"]), int(state["position"]), int(state["epoch"])
    except (KeyError, TypeError, ValueError):
        raise PgolfError(f"data position {state!r} needs integer file_index, position, epoch") from None
    if not 0 <= index < len(stream.files):
        raise PgolfError(f"data position refers to shard #{index}, but there are {len(stream.files)} shards")
    tokens = (
        stream.tokens if index == stream.file_index else read_shard(stream.files[index], stream.vocab_size)
    )
    if not 0 <= position <= len(tokens) or epoch < 1:
        raise PgolfError(
            f"data position {position} (epoch {epoch}) does not fit shard {stream.files[index]} "
            f"of {len(tokens)} tokens"
        )
    stream.tokens, stream.file_index, stream.position, stream.epoch = tokens, index, position, epoch


def _restore_coprime(loader: CoprimeLoader, state: Any) -> None:
    """A `CoprimeLoader.state()` back into `loader`."""
    if not isinstance(state, dict) or state.get("loader") != "coprime":
        keys = sorted(state) if isinstance(state, dict) else state
        raise PgolfError(
            f"data position {keys!r} was not written by the coprime loader (train_loader=coprime); "
            "resume with the train_loader the run started with"
        )
    n = len(loader.files)
    try:
        seed, shards = int(state["seed"]), int(state["shards"])
        seq_len, calls = int(state["seq_len"]), int(state["calls"])
        rng = state["rng"]
        bit_state = {
            "bit_generator": "PCG64",
            "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
            "has_uint32": int(rng["has_uint32"]),
            "uinteger": int(rng["uinteger"]),
        }
        cursors = {
            key: np.array(state["cursors"][key], dtype=np.bool_ if key == "active" else np.int64)
            for key in ("phase", "blocks", "next", "start", "stride", "active")
        }
    except (KeyError, TypeError, ValueError):
        raise PgolfError(
            "the coprime loader's data position needs seed, shards, seq_len, calls, rng and cursors"
        ) from None
    if seed != loader.seed or shards != n:
        raise PgolfError(
            f"the data position was saved over {shards} shards (names hash {seed}), but these are "
            f"{n} shards (names hash {loader.seed}) in {loader.files[0].parent}"
        )
    if any(c.shape != (n,) for c in cursors.values()) or seq_len < 0 or calls < 0:
        raise PgolfError(f"the coprime loader's data position does not describe {n} shards")
    on = cursors["active"]
    if seq_len and on.any():
        expected = (loader.num_tokens[on] - 1 - cursors["phase"][on]) // seq_len
        if not (
            np.array_equal(cursors["blocks"][on], expected)
            and np.all((cursors["next"][on] >= 0) & (cursors["next"][on] <= expected))
        ):
            raise PgolfError(
                f"the coprime loader's data position does not fit the shards in {loader.files[0].parent} "
                "(a shard changed size since it was saved)"
            )
    try:
        loader.rng.bit_generator.state = bit_state
    except (TypeError, ValueError) as exc:
        raise PgolfError(f"the coprime loader's RNG state is not valid: {exc}") from None
    loader.seq_len, loader.calls = seq_len, calls
    loader.phase, loader.blocks, loader.next = cursors["phase"], cursors["blocks"], cursors["next"]
    loader.start, loader.stride, loader.active = cursors["start"], cursors["stride"], cursors["active"]


# ------------------------------------------------------------------- artifacts
def read_artifact(path: str | Path, allow_pickle: bool = False) -> Int8Model | MixedModel:
    """Any artifact pgolf reads: its own (either format), the challenge's int8 ones (core/artifact/upstream.py),
    a record's int6 one (core/artifact/records.py); damage is one PgolfError line."""
    path = Path(path)
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    if is_container(blob):
        try:
            return check_model(from_container(check_container(open_any(blob, path))))
        except PgolfError as exc:  # e.g. a compressor package that is not installed
            raise PgolfError(f"artifact {path}: {exc}") from None
        except Exception as exc:  # any decoding failure, anything wrong in what it holds: the input's
            raise PgolfError(f"artifact {path} is damaged: {first_line(exc)}") from None
    if not _is_zlib(blob):  # brotli, lzma or zstd: a record's
        return load_record_artifact(path)
    try:  # the challenge's own int8 containers
        return load_artifact(path, allow_pickle=allow_pickle)
    except PgolfError as not_int8:
        try:  # a record's artifact may be zlib-compressed too
            return load_record_artifact(path)
        except PgolfError:
            raise not_int8 from None


def _is_zlib(blob: bytes) -> bool:
    """A zlib stream: its two-byte header (deflate; a multiple of 31), and a start that inflates."""
    if len(blob) < 2 or blob[0] & 0x0F != 8 or (blob[0] << 8 | blob[1]) % 31:
        return False
    try:
        zlib.decompressobj().decompress(blob[:4096], 1)
    except zlib.error:
        return False
    return True


def load_mixed_artifact(path: str | Path) -> MixedModel:
    """Read a mixed-precision artifact; any damage is one PgolfError line naming the file."""
    path = Path(path)
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    try:
        return check_mixed(mixed_from_container(check_container(open_any(blob, path), MIXED_FORMAT)))
    except PgolfError as exc:  # e.g. a compressor package that is not installed
        raise PgolfError(f"artifact {path}: {exc}") from None
    except Exception as exc:  # any decoding failure of a damaged file is a problem with the input
        raise PgolfError(
            f"artifact {path} is damaged or not a mixed-precision artifact: {first_line(exc)}"
        ) from None


def saved_config(path: str | Path) -> tuple[dict[str, Any], str] | None:
    """The settings a set of weights was trained and scored with, and where they were found: a
    checkpoint's own config, the run's `config.json` beside an artifact, or the settings a pgolf
    artifact keeps (`scoring_config`); None for an artifact without any (the challenge's, a record's)."""
    path = Path(path)
    if is_checkpoint(path):
        return checkpoint_config(path), f"checkpoint {path}"
    beside = path.parent / "config.json"
    if beside.exists():  # a FIFO or a device there is refused by name, not passed over
        return read_run_config(beside), str(beside)
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    if not is_container(blob):
        return None
    try:
        kept = open_any(blob, path).meta.get("config")
    except PgolfError as exc:  # not damage: e.g. the program its compressor needs is not installed
        raise PgolfError(f"artifact {path}: {exc}") from None
    except Exception as exc:  # a damaged file: its reader names the problem when the weights are read
        raise PgolfError(f"artifact {path} is damaged: {first_line(exc)}") from None
    if kept is not None and not isinstance(kept, dict):  # refused as a kept setting of a bad value is
        raise PgolfError(
            f"artifact {path} keeps settings pgolf refuses: config: its settings must be a table of fields, "
            f"got {type(kept).__name__} {str(kept)[:40]!r}"
        )
    return (kept, f"artifact {path}") if kept else None


# --------------------------------------------------------- weights and config
def check_artifact_tokenizer(
    model: Int8Model | MixedModel, path: str | Path, tokenizer_path: str | Path
) -> None:
    """Refuse to score the artifact `path` with another tokenizer than the one it keeps the SHA-256 of
    (an artifact without one, or a tokenizer file that is not there, is not checked here)."""
    kept = getattr(model, "tokenizer_sha256", None)
    if kept is None or not Path(tokenizer_path).is_file():
        return
    given = file_sha256(tokenizer_path, "tokenizer")
    if given != kept:
        raise PgolfError(
            f"artifact {path} was trained with another tokenizer than {tokenizer_path} (SHA-256 "
            f"{kept[:12]}…, this file's {given[:12]}…): set --tokenizer-path (or --dataset) to its own"
        )


def load_weights(
    path: str | Path, cfg: Config, allow_pickle: bool = False
) -> tuple[dict[str, np.ndarray], Config]:
    """Float32 weights from a checkpoint or an artifact (any format core.artifact.export reads), and the
    config they fit.

    A checkpoint brings its own model config; for an artifact the shape is read
    off the tensors. Data paths and evaluation settings always come from `cfg`.
    """
    cfg.validate()
    if is_checkpoint(path):
        params = load_checkpoint(path).params
    else:
        model = read_artifact(path, allow_pickle=allow_pickle)
        check_artifact_tokenizer(model, path, cfg.tokenizer_path)
        params = dequantize(model)
    return params, config_for_params(cfg, {k: tuple(v.shape) for k, v in params.items()}).validate()


# What config_for_params reads off a set of weights.
SHAPE_FIELDS = (
    "vocab_size",
    "model_dim",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "mlp_mult",
    "tie_embeddings",
)


def artifact_compressor(path: str | Path) -> str | None:
    """The compressor a record's artifact was written with (by its magic bytes; core.artifact.records);
    None for pgolf's own container, whose reader finds its compressor itself."""
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    return None if is_container(blob) else record_compressor(blob)


def config_for_params(cfg: Config, shapes: dict[str, tuple[int, ...]]) -> Config:
    """`cfg` with the model shape read off a set of weights (e.g. an upstream artifact).

    Everything the shapes determine is taken from them: vocabulary, width, depth,
    heads (q_gain has one entry per head), KV heads, MLP width and head tying.
    Settings that leave no trace in the shapes (softcap, RoPE) stay as in `cfg`.
    """
    try:
        vocab, dim = shapes["tok_emb.weight"]
        # A name's layer index is checked before anything is sized by it (a damaged one reads
        # blocks.999999999): at most MAX_LAYERS, and no more layers than there are tensors.
        layers = 1 + max(_layer_index(n) for n in shapes if n.startswith("blocks."))
        if layers > min(len(shapes), MAX_LAYERS):
            raise PgolfError(
                f"weights: a block index up to {layers - 1} among {len(shapes)} tensors "
                f"(a model has at most {MAX_LAYERS} layers, each of several tensors)"
            )
        heads = shapes["blocks.0.attn.q_gain"][0]
        kv_heads = shapes["blocks.0.attn.c_k.weight"][0] // (dim // heads)
        hidden = shapes["blocks.0.mlp.fc.weight"][0]
    except (KeyError, ValueError, IndexError, ZeroDivisionError, TypeError):
        raise PgolfError(
            "weights do not have the layout of pgolf's GPT (missing or malformed tensors)"
        ) from None
    mlp_mult = hidden / dim
    out = cfg.replace(
        vocab_size=vocab,
        model_dim=dim,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        mlp_mult=int(mlp_mult) if float(mlp_mult).is_integer() else mlp_mult,
        tie_embeddings="lm_head.weight" not in shapes,
    )
    check_layout(out, shapes, "weights")
    return out


def _layer_index(name: str) -> int:
    """The N of "blocks.N.…"; ValueError when it is not a plain decimal number."""
    part = name.split(".")[1] if name.count(".") >= 2 else ""
    if not (part.isascii() and part.isdigit()):
        raise ValueError(f"layer index of {name!r}")
    return int(part)


# ------------------------------------------------------------- initial weights
# The records from 2026-04-23 on keep each kind of block matrix of all layers in one bank, a 3-D
# tensor; pgolf keeps one matrix per layer. A bank's slices are its parts' matrices, part after part,
# each of layers 0..n-1 (qo_bank = [c_q of each layer, then proj of each layer]).
RECORD_BANKS = {
    "qo_bank": ("attn.c_q.weight", "attn.proj.weight"),
    "kv_bank": ("attn.c_k.weight", "attn.c_v.weight"),
    "mlp_up_bank": ("mlp.fc.weight",),
    "mlp_down_bank": ("mlp.proj.weight",),
}
# What wraps a model's state-dict names when it is saved from a compiled or a DDP model.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def record_names_to_pgolf(state: dict[str, np.ndarray], num_layers: int, what: str) -> dict[str, np.ndarray]:
    """A record's state dict under pgolf's names: the wrappers' prefixes dropped, the banks split into
    per-layer matrices (`RECORD_BANKS`); every other name is already pgolf's."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in state.items():
        for prefix in WRAPPER_PREFIXES:
            name = name.removeprefix(prefix)
        parts = RECORD_BANKS.get(name)
        if parts is None:
            out[name] = tensor
            continue
        count = len(parts) * num_layers
        if tensor.ndim != 3 or tensor.shape[0] != count:
            raise PgolfError(
                f"{what}: {name} is shape {tuple(tensor.shape)}, but the config expects {count} matrices "
                f"({len(parts)} per layer, {num_layers} layers)"
            )
        for j, part in enumerate(parts):
            for i in range(num_layers):
                out[f"blocks.{i}.{part}"] = tensor[j * num_layers + i]
    return out


def _torch_state_dict(path: Path, blob: bytes) -> dict[str, np.ndarray]:
    """A torch.save'd dict of tensors (a record's `final_model.pt`), opened with weights_only=True."""
    import io

    try:
        import torch
    except ImportError:
        raise PgolfError(
            f"{path}: reading a torch state dict needs PyTorch: pip install 'pgolf[torch]'"
        ) from None
    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged file, or one holding more than tensors
        raise PgolfError(f"{path}: not a readable torch state dict: {first_line(exc)}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise PgolfError(f"{path}: a torch file of weights must hold one dict of named tensors")
    return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def load_init_weights(path: str | Path, cfg: Config) -> dict[str, np.ndarray]:
    """The weights a run starts from (`init_from`): a pgolf checkpoint's parameters, a safetensors
    file of weights, or a torch state dict (a record's `final_model.pt`), under pgolf's names or the
    records' (`record_names_to_pgolf`), as float32; refused in one line naming the first tensor that
    is missing, extra, of another shape or not finite."""
    path = Path(path)
    what = f"init_from {path}"
    if names_checkpoint_format(path):
        state = load_checkpoint(path).params
    else:
        blob = read_file(path, "weights", MAX_CHECKPOINT_BYTES)
        if blob[8:9] == b"{":  # a safetensors header is JSON
            try:
                state = st_load(blob)
            except (SafetensorError, ValueError, TypeError) as exc:
                raise PgolfError(f"{what}: not a readable safetensors file: {first_line(exc)}") from None
        elif blob.startswith(b"PK"):  # torch.save's zip
            state = _torch_state_dict(path, blob)
        else:
            raise PgolfError(f"{what}: not a pgolf checkpoint, a safetensors file or a torch state dict")
    params = record_names_to_pgolf(state, cfg.num_layers, what)
    check_layout(cfg, {k: tuple(v.shape) for k, v in params.items()}, what)
    params = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    try:
        check_finite(params)
    except ValueError as exc:
        raise PgolfError(f"{what}: {exc}") from None
    return params
