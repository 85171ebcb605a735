"""The distributed settings `torchrun` gives each process, read and checked in one place.

torchrun sets WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; a plain
process has none of them and is the one process of a world of one. Values set by hand are checked
before any work (the CLI's `main`, a packaged train_gpt.py's first step): anything torch would choke
on later, or that would train the wrong share of the data, is one line naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from core.common.errors import PgolfError

MAX_WORLD_SIZE = 2**20  # far above any job: it bounds a typo before anything is sized by it
TORCHRUN = "launch several processes with `torchrun` (it sets them all), or unset it"


@dataclass(frozen=True)
class Launch:
    """Where this process stands in its job: `rank` of `world_size`, `local_rank` of `local_world_size`
    on its machine (which device it takes)."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1


def _whole(environ: Mapping[str, str], name: str, default: int, low: int, high: int, rule: str) -> int:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip(), 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise PgolfError(f"{name}={text!r} {rule}: {TORCHRUN}")
    return value


def launch(environ: Mapping[str, str] | None = None) -> Launch:
    """This process's place in its job, from `environ` (default: the process's environment); a value
    out of range, or a world of several processes without torchrun's rendezvous, is a PgolfError."""
    env = os.environ if environ is None else environ
    world = _whole(env, "WORLD_SIZE", 1, 1, MAX_WORLD_SIZE, "must be a whole number of processes >= 1")
    if world > 1:
        missing = [
            n for n in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(n, "").strip()
        ]
        if missing:
            raise PgolfError(
                f"WORLD_SIZE={world} without {', '.join(missing)}: several processes meet through "
                "torchrun's rendezvous: launch them with `torchrun`, not by setting WORLD_SIZE by hand"
            )
        _whole(env, "MASTER_PORT", 0, 1, 65535, "must be a port number (1..65535)")
    rank = _whole(env, "RANK", 0, 0, world - 1, f"must be a whole number below WORLD_SIZE={world}")
    local_world = _whole(
        env, "LOCAL_WORLD_SIZE", 1 if world == 1 else world, 1, world,
        f"must be a whole number of processes from 1 to WORLD_SIZE={world}",
    )  # fmt: skip
    local_rank = _whole(
        env, "LOCAL_RANK", 0, 0, min(rank, local_world - 1),
        f"must be a whole number from 0 to RANK={rank}, below LOCAL_WORLD_SIZE={local_world}",
    )  # fmt: skip
    return Launch(world, rank, local_rank, local_world)
