"""Data for the tests: the challenge's files, a prepared dataset pointed at by a config, a data folder's
digest."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from core.config.fields import Config
from core.config.presets import preset
from tests.support import ROOT

CHALLENGE = ROOT / "tests" / "fixtures" / "challenge"  # the challenge's sp1024 tokenizer and manifest


@dataclass(frozen=True)
class Dataset:
    root: Path
    data_path: Path
    tokenizer_path: Path
    vocab_size: int

    def config(self, name: str = "smoke", **changes) -> Config:
        """A preset pointed at this dataset."""
        return preset(name).replace(
            data_path=str(self.data_path),
            tokenizer_path=str(self.tokenizer_path),
            vocab_size=self.vocab_size,
            **changes,
        )


def digest(root):
    """sha256 of every file by path, a dataset's shards under the name of its link (not of its version)."""
    return {
        re.sub(r"^datasets/\.(.+)-\d+/", r"datasets/\1/", p.relative_to(root).as_posix()): hashlib.sha256(
            p.read_bytes()
        ).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
