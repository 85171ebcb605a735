"""`python cli.py ARGS` (or any `python SCRIPT ARGS`, `python -m MODULE ARGS`: a packaged train_gpt.py,
torchrun) for the tests, without paying for the heavy imports each time: a test helper, not part of pgolf
(tests/support/cli.py starts it, one per test worker).

It imports the libraries every command needs and that take seconds (PyTorch, its compiler stack that
an optimizer loads, numpy, typer, rich) and every module of pgolf's packages (none acts when imported:
no setting, no read of the environment or the working folder; `cli.py`, which does, is left to the
command), then reads one request per line on its standard input: JSON {"argv", "cwd", "env",
"stdout", "stderr", "address_space", "own_session"}. For each it forks a process that takes that folder,
that environment (os.environ replaced, as `subprocess.run(env=...)` gives it), its standard output and
error to those files (both to the first where "stderr" is null), its input from /dev/null, given
"address_space" that limit on its memory in bytes (RLIMIT_AS), given "own_session" a session of its own
(a process group to signal), and runs `python ARGV` as the interpreter does (`__main__`, sys.argv,
sys.path's first entry the script's folder or, with -m, the working folder, the interpreter's own ending:
atexit, flushing, a traceback for a bug). The server writes `pid <n>` when the process starts and
`exit <code>` when it ends (negative: the signal that ended it, as subprocess gives it). Only those two
lines come back: the command's output is in its files.

The server starts no thread (checked before each fork: a forked process gets a copy of a lock another
thread held, and no thread to release it), so a command begins as in a fresh process, the imports done.
The BLAS libraries start their threads when they load, so the server runs with one BLAS thread
(tests/support/cli.py sets it), as the test workers do.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import resource
import runpy
import sys
import traceback
from pathlib import Path
from typing import NoReturn

# torch._dynamo: what building a torch.optim optimizer imports. PyTorch or MLX may be missing (a machine
# with one framework): the modules that need it are left out.
for name in ("numpy", "rich.console", "typer", "torch", "torch._dynamo"):
    with contextlib.suppress(ImportError):
        importlib.import_module(name)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import PGOLF_PACKAGES  # noqa: E402  (ROOT first on the path)

for package in PGOLF_PACKAGES:
    for module in pkgutil.walk_packages([str(ROOT / package)], f"{package}."):
        with contextlib.suppress(ImportError):
            importlib.import_module(module.name)
del sys.path[0]


def threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def command(request: dict) -> NoReturn:
    """In the forked process: the request's folder, environment, files (standard error into standard
    output's where "stderr" is null), session (a new one, given "own_session") and limit, then its command."""
    if request.get("own_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644) if path else os.dup(1)
        os.dup2(opened, fd)
        os.close(opened)
    if request.get("address_space"):
        resource.setrlimit(resource.RLIMIT_AS, (request["address_space"], request["address_space"]))
    run_as_python(request["argv"])


def run_as_python(argv: list[str]) -> NoReturn:
    """`python ARGV` in this (forked) process; never returns. It ends as the interpreter would (atexit's
    functions, the streams flushed, the exit status of SystemExit or 1 and a traceback for another
    exception) but for the modules' teardown, which in a forked process copies every page the server's
    imports fill (most of a second, to free memory the process is about to give back)."""
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[0] = argv[1:], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = argv, str(Path(argv[0]).parent)
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve() -> None:
    # The imports' objects out of the collector's sight: a forked command's collections would otherwise walk
    # them all, copying the pages they sit on (docs/tests.md).
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        if threads() != 1:
            raise SystemExit(f"cli_server: {threads()} threads before a fork")
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            command(request)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    serve()
