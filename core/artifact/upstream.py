"""The challenge's own int8 containers, in the format of core/artifact/int8_format.py.

- Its torch container, `final_model.int8.ptz`: `torch.save` of a dict of tensors, then zlib;
  read with `torch.load(weights_only=True)` (tensors and plain containers only) and written
  (`export --format upstream`). torch is imported here, lazily, and only for this.
- Its MLX script's container: a pickle, then zlib; read only when explicitly allowed, as
  unpickling can run code.

A training run never reads or writes these; `load_artifact` also reads pgolf's own int8
container, so one call reads any int8 artifact.
"""

from __future__ import annotations

import io
import pickle
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from core.artifact import container, quantized
from core.artifact.checks import check_container, check_int8, is_container, names_to
from core.artifact.container import ArtifactInfo, open_any, write_artifact
from core.artifact.int8_format import QUANT_FORMAT, int8_from_container
from core.artifact.quantized import Int8Model
from core.common import compress
from core.common.errors import PgolfError, first_line
from core.common.files import read_file

__all__ = ["load_artifact", "save_upstream_torch"]


def _from_upstream_dict(obj: Any, to_numpy: Any) -> Int8Model:
    if not isinstance(obj, dict) or obj.get("__quant_format__") != QUANT_FORMAT:
        raise ValueError(f"not a {QUANT_FORMAT} object")

    def arrays(key: str) -> dict[str, np.ndarray]:
        return {k: to_numpy(v) for k, v in names_to(obj, key, object).items()}

    def optional(key: str, kind: type) -> dict:  # absent from some of upstream's files
        return names_to(obj, key, kind) if key in obj else {}

    return Int8Model(
        quantized=arrays("quantized"),
        scales=arrays("scales"),
        dtypes=names_to(obj, "dtypes", str),
        passthrough=arrays("passthrough"),
        passthrough_orig_dtypes=optional("passthrough_orig_dtypes", str),
        qmeta=optional("qmeta", dict),
    )


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:  # numpy has no bf16; float32 holds its values exactly
        t = t.float()
    return t.detach().cpu().contiguous().numpy()


def _parse_upstream_torch(raw: bytes, path: Path) -> Int8Model:
    try:
        import torch
    except ImportError:
        raise PgolfError(
            f"artifact {path}: reading the upstream torch artifact needs PyTorch: pip install 'pgolf[torch]'"
        ) from None
    obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    return _from_upstream_dict(obj, _torch_to_numpy)


def load_artifact(path: str | Path, allow_pickle: bool = False) -> Int8Model:
    """Read pgolf's container, or the challenge's torch (or, if allowed, MLX pickle) container."""
    path = Path(path)
    blob = read_file(path, "artifact", container.MAX_ARTIFACT_BYTES)
    try:
        if is_container(blob):
            return check_int8(
                int8_from_container(check_container(open_any(blob, path), quantized.CONTAINER_FORMAT))
            )
        raw = compress.decompress(blob, "zlib")
        if raw.startswith(b"PK"):  # a zip: what torch.save writes
            return check_int8(_parse_upstream_torch(raw, path))
        if raw[:1] == b"\x80":  # a pickle's protocol opcode: the upstream MLX script's container
            if not allow_pickle:
                raise PgolfError(
                    f"artifact {path} is a pickle (the upstream MLX format); unpickling can run code, "
                    "so it is read only if you trust it and allow it (allow_pickle=True, --allow-pickle)"
                )
            warnings.warn(f"unpickling {path}: only do this for files you trust", stacklevel=2)
            return check_int8(_from_upstream_dict(pickle.loads(raw), np.asarray))
    except PgolfError:
        raise
    except Exception as exc:  # any decoding failure of a damaged file is a problem with the input
        raise PgolfError(f"artifact {path} is damaged or not an int8 artifact: {first_line(exc)}") from None
    raise PgolfError(f"artifact {path} is not an int8 artifact (unknown container)")


def save_upstream_torch(path: str | Path, model: Int8Model) -> ArtifactInfo:
    """Write the challenge's own container (torch.save + zlib 9), loadable by its train_gpt.py."""
    try:
        import torch
    except ImportError:
        raise PgolfError(
            f"artifact {path}: writing the upstream torch artifact needs PyTorch: pip install 'pgolf[torch]'"
        ) from None

    def tensors(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        # Scales and passthrough already have upstream's dtypes (fp16, fp32 control, int).
        return {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}

    obj: dict[str, Any] = {
        "__quant_format__": QUANT_FORMAT,
        "quantized": tensors(model.quantized),
        "scales": tensors(model.scales),
        "dtypes": dict(model.dtypes),
        "passthrough": tensors(model.passthrough),
    }
    if model.qmeta:
        obj["qmeta"] = dict(model.qmeta)
    if model.passthrough_orig_dtypes:
        obj["passthrough_orig_dtypes"] = dict(model.passthrough_orig_dtypes)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    raw = buffer.getvalue()

    def read(blob: bytes) -> None:
        if zlib.decompress(blob) != raw:
            raise ValueError("zlib gave back other bytes")

    return write_artifact(path, zlib.compress(raw, level=9), "upstream-torch", read)
