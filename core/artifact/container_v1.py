"""pgolf's containers as the readers of other files open them (`open_any`): their metadata checked,
and pgolf's first container (MAGIC_V1) too, the same layout as the current one (core/artifact/int8.py)
without the trailing checksum of the payload, read with a warning: damage to it cannot be detected.
A run reads back the container it has just written with int8.open_container alone.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from core.artifact.int8 import MAGIC, Container, open_container, unpack_body

MAGIC_V1 = b"PGOLF-INT8\x00"  # the first container: no checksum


def open_any(blob: bytes, source: str | Path) -> Container:
    """The parts of a pgolf container of either layout, as the readers of other files than a run's own
    open them: its metadata checked (a map naming its format); ValueError when damaged. A first
    container gets a warning naming `source`, and is opened as the current layout holding the
    checksum of its own payload."""
    if blob.startswith(MAGIC_V1):
        warnings.warn(
            f"{source} was written before pgolf's containers carried a checksum: damage to it cannot "
            "be detected (export it again to add one)",
            stacklevel=2,
        )
        packed = blob[len(MAGIC_V1) :]
        payload, _, _ = unpack_body(packed)
        blob = MAGIC + packed + hashlib.sha256(payload).digest()
    box = open_container(blob)
    if not isinstance(box.meta, dict) or not isinstance(box.meta.get("format"), str):
        raise ValueError("no pgolf metadata")
    return box
