"""torchrun whose ranks are forks of this process instead of fresh interpreters: a test helper, not part of
pgolf.

`python tests/torchrun_forked.py TORCHRUN_ARGS SCRIPT ARGS` is `torchrun TORCHRUN_ARGS SCRIPT ARGS` (the
ranks' `python -u SCRIPT ARGS`), but each rank is a fork of this process, which has imported what
tests/cli_server.py imports (PyTorch, its compiler stack, numpy, typer, rich, pgolf's modules): a rank
starts where a fresh one would be after seconds of imports. When this process is itself forked from the CLI
server (tests/support/backends.py's `run_ranks`), those imports are done already.

Everything else is torchrun's own: the rendezvous, each rank's environment and output files, its watch
over the ranks, the signals it sends. A rank is the leader of a session of its own, as torchrun's Popen
makes it (torchrun signals the rank's process group), starts with the signal handlers this process had
before torchrun installed its own, and writes unbuffered, as `python -u` does. What differs from a fresh
rank is what was imported before the rank's environment was set, which pgolf's modules never read when
imported (tests/cli_server.py). One test keeps torchrun's own fresh ranks
(test_torchrun_without_data_prepares_one_dataset_and_matches_one_process).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import IO, NoReturn

import cli_server  # the imports a rank would otherwise make (tests/ is this script's sys.path[0])
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

# Before torchrun's agent installs its handlers: the dispositions a fresh rank starts with.
HANDLERS = {
    s: signal.getsignal(s)
    for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    if signal.getsignal(s) is not None
}


class ForkedRank:
    """What torchrun uses of a rank's subprocess.Popen (pid, poll, wait, returncode), for a fork."""

    def __init__(self, args: tuple[str, ...], env: dict[str, str], stdout: IO | None, stderr: IO | None):
        self.args, self.returncode = args, None
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python 3.12+ warns of forking beside torchrun's threads, which the
            # rank never touches (torch's own "fork" start method forks beside them too)
            warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
            self.pid = os.fork()
        if self.pid == 0:
            rank(list(args[1:]), env, stdout, stderr)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


def rank(argv: list[str], env: dict[str, str], stdout: IO | None, stderr: IO | None) -> NoReturn:
    """In the fork: `python ARGV` as torchrun's Popen would start it."""
    os.setsid()
    for signum, handler in HANDLERS.items():
        signal.signal(signum, handler)
    os.environ.clear()
    os.environ.update(env)
    for fd, file in ((1, stdout), (2, stderr)):
        if file is not None:
            os.dup2(file.fileno(), fd)
    if argv[0] == "-u":
        argv = argv[1:]
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                             write_through=True)
            for fd, old in ((1, sys.stdout), (2, sys.stderr))
        )  # fmt: skip
    cli_server.run_as_python(argv)


def forked_popen(handler: SubprocessHandler, args: tuple[str, ...], env: dict[str, str]) -> ForkedRank:
    return ForkedRank(args, env, handler._stdout, handler._stderr)


if __name__ == "__main__":
    SubprocessHandler._popen = forked_popen
    sys.argv[0] = "torchrun"
    torchrun.main()
