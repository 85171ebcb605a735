"""The distributed settings `torchrun` gives each process, read and checked in one place.

torchrun sets WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; a plain
process has none of them and is the one process of a world of one. Values set by hand are checked
before any work (the CLI's `main`, a packaged train_gpt.py's first step): anything torch would choke
on later, or that would train the wrong share of the data, is one line naming the variable.
"""

from __future__ import annotations

import os
import re
import socket
import time
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


DEFAULT_WAIT_SECONDS = 1800.0  # with no collective timeout: gloo's own default


def reach_rank_0(place: Launch, timeout_seconds: float, environ: Mapping[str, str] | None = None) -> None:
    """A rank other than 0 first reaches the rendezvous (MASTER_ADDR:MASTER_PORT), retrying until the
    timeout: when nothing ever answers there, one line (`rendezvous_failed`) rather than the framework's
    own connect, which logs a C++ stack at each try."""
    if place.rank == 0:
        return
    env = os.environ if environ is None else environ
    address = (env.get("MASTER_ADDR", ""), int(env.get("MASTER_PORT", "0")))
    deadline = time.monotonic() + (timeout_seconds if timeout_seconds > 0 else DEFAULT_WAIT_SECONDS)
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection(address, timeout=max(0.1, min(left, 5.0))).close()
            return
        except OSError:  # refused (not listening yet), timed out, or a name that does not resolve
            if left <= 0:
                raise rendezvous_failed(place, timeout_seconds, "could not connect", env) from None
            time.sleep(min(0.2, max(left, 0.0)))


def rendezvous_failed(
    place: Launch, timeout_seconds: float, detail: str, environ: Mapping[str, str] | None = None
) -> PgolfError:
    """The one line for ranks that did not all meet: which never came, where, within how long. `detail` is
    the framework's own message (PyTorch's store: "... 1/2 clients joined.", or a client's "timed out
    ... while trying to connect"); the ranks it does not name are told by their count."""
    env = os.environ if environ is None else environ
    world, where = place.world_size, f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    waited = f"{timeout_seconds:g} s (collective_timeout_seconds)" if timeout_seconds > 0 else "the timeout"
    joined = re.search(r"(\d+)/\d+ clients joined|num_workers_joined=(\d+)", detail)
    if place.rank != 0 and re.search(r"connect", detail, re.I):
        missing = "rank 0 never came"
    elif joined:
        count = int(joined[1] or joined[2])
        others = "rank 1" if world == 2 else f"ranks 1 to {world - 1}"
        missing = f"{others} never came" if count == 1 else f"{world - count} of the {world} ranks never came"
    else:
        missing = "the ranks did not all come"
    return PgolfError(
        f"rank {place.rank} of WORLD_SIZE={world}: {missing} to the rendezvous at {where} within {waited}: "
        f"start all {world} (`torchrun --nproc_per_node={world}` starts them together)"
    )
