"""pgolf's first container (MAGIC_V1): the same layout as the current one (core/artifact/int8.py)
without the trailing checksum of the payload. Still read by the readers of other files, with a
warning: damage to it cannot be detected. A run reads back the container it has just written with
int8.open_container alone: never a first one.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from core.artifact.int8 import MAGIC, Container, open_container
from core.common import compress

MAGIC_V1 = b"PGOLF-INT8\x00"  # the first container: no checksum


def open_any(blob: bytes, source: str | Path) -> Container:
    """The parts of a pgolf container of either layout; ValueError when damaged. A first container
    gets a warning naming `source`, and is opened as the current layout holding the checksum of its
    own payload."""
    if not blob.startswith(MAGIC_V1):
        return open_container(blob)
    warnings.warn(
        f"{source} was written before pgolf's containers carried a checksum: damage to it cannot "
        "be detected (export it again to add one)",
        stacklevel=2,
    )
    packed = blob[len(MAGIC_V1) :]
    payload, _, _ = compress.unpack(packed)
    return open_container(MAGIC + packed + hashlib.sha256(payload).digest())
