"""pgolf's first container (core/artifact/int8.py's MAGIC_V1): the same layout as the current one
without the trailing checksum of the payload. Still read, with a warning: damage to it cannot be
detected. Only readers of older files come here (a run reads back the container it has just written).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from core.artifact.int8 import MAGIC_V1
from core.common import compress


def unpack_v1(blob: bytes, source: str | Path) -> tuple[bytes, str, int]:
    """(payload, compressor name, shuffle stride) of a first container, whose file `source` names in
    the warning; ValueError when damaged."""
    warnings.warn(
        f"{source} was written before pgolf's containers carried a checksum: damage to it cannot "
        "be detected (export it again to add one)",
        stacklevel=3,  # the caller of int8.open_container
    )
    return compress.unpack(blob[len(MAGIC_V1) :])
