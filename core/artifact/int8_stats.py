"""The challenge's export statistics of an int8 model (its torch script logs them): not a training
run's, which reports its artifact's sizes (core/artifact/export.py)."""

from __future__ import annotations

import numpy as np

from core.artifact.int8 import FLOAT_BYTES, Int8Model, model_parts


def int8_stats(
    state: dict[str, np.ndarray], model: Int8Model, orig_dtypes: dict[str, str] | None = None
) -> dict[str, int]:
    """Counts and bytes of `model`, the int8 quantization of `state` (`orig_dtypes`: the dtype each
    weight had in the model, as given to quantize_int8): parameters, tensors (float ones quantized,
    non-float ones), the tensors' bytes in the model, and the bytes the int8 model stores."""
    orig_dtypes = orig_dtypes or {}
    arrays = {name: np.asarray(value) for name, value in state.items()}
    floats = {name for name, t in arrays.items() if np.issubdtype(t.dtype, np.floating)}
    baseline = sum(
        t.size * FLOAT_BYTES[orig_dtypes.get(name, t.dtype.name)] if name in floats else t.nbytes
        for name, t in arrays.items()
    )
    return {
        "param_count": int(sum(t.size for t in arrays.values())),
        "num_tensors": len(arrays),
        "num_float_tensors": len(model.quantized),
        "num_nonfloat_tensors": len(arrays) - len(floats),
        "baseline_tensor_bytes": int(baseline),
        "int8_payload_bytes": int(
            sum(a.nbytes for part in model_parts(model).values() for a in part.values())
        ),
    }
