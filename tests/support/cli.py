"""cli.py for the tests: `cli(...)`, a command in a process of its own (forked from tests/cli_server.py),
`python(...)`, any script or module so (a packaged train_gpt.py, torchrun), `start_cli(...)`, a command
left running (to be signalled), `cli_after` (a command with a hook replaced first), and
`assert_one_line_error`, the one check of a refusal."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support import ROOT

# A process started in the folder the suite runs in (conftest.py: hermetic), not the checkout, imports pgolf by this.
IMPORTABLE = {"PYTHONPATH": str(ROOT)}


class CLIServer:
    """tests/cli_server.py, started on first use: it forks each `cli.py` command (or other script) from a
    process that has imported PyTorch and the rest already (two to five seconds less of CPU a command)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.lines: queue.Queue[str] = queue.Queue()

    def run(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        address_space: int | None = None,
    ) -> subprocess.CompletedProcess:
        started = self.start(argv, cwd, env, address_space)
        try:
            started.wait(timeout)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait(60)
            raise
        return subprocess.CompletedProcess(
            ["python", *argv], started.returncode, *started.communicate(timeout=0)
        )

    def start(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        address_space: int | None = None,
        merged: bool = False,
        own_session: bool = False,
    ) -> Started:
        """`python ARGV` forked and left running (`address_space`: its memory limit in bytes; `merged`: its
        standard error into its standard output; `own_session`: the leader of a new session); the server
        serves nothing else until it has ended."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "cli_server.py")], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            )  # fmt: skip
            self.lines = queue.Queue()
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        folder = Path(os.environ["PGOLF_CACHE_DIR"]).parent / "cli-output" / str(os.getpid())
        folder.mkdir(parents=True, exist_ok=True)
        out, err = folder / "stdout", folder / "stderr"
        for path in (out, err):  # empty before the command opens them: nothing of the last one is read
            path.write_text("")
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                   "stderr": None if merged else str(err), "address_space": address_space,
                   "own_session": own_session}  # fmt: skip
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return Started(self, int(self._line("pid", 60)), out, err)

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put("")  # the server ended

    def _line(self, word: str, timeout: float) -> str:
        """The value of the server's next line, `WORD <value>`; TimeoutExpired after `timeout` s."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise subprocess.TimeoutExpired(f"cli.py ({word})", timeout) from None
        head, _, value = line.strip().partition(" ")
        if head != word:
            raise RuntimeError(f"cli_server ended or said {line!r} instead of {word} <value>")
        return value


class Started:
    """A command the CLI server forked, running: what the tests use of subprocess.Popen's (`pid`,
    `stdout` read line by line as it is written, `send_signal`, `kill`, `poll`, `wait`, `communicate`,
    `returncode`)."""

    def __init__(self, server: CLIServer, pid: int, out: Path, err: Path) -> None:
        self.server, self.pid, self.returncode, self.err = server, pid, None, err
        self._unread = out.open(encoding="utf-8", errors="replace")
        self.stdout = self._lines()

    def _lines(self):
        line = ""
        while True:
            line += self._unread.readline()
            if line.endswith("\n"):
                yield line
                line = ""
            elif self.poll() is not None:
                yield from (line + self._unread.read()).splitlines(keepends=True)
                return
            else:
                time.sleep(0.01)

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            self.returncode = int(self.server._line("exit", timeout))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float) -> tuple[str, str]:
        """The output not yet read and the whole error output, once the command has ended."""
        self.wait(timeout)
        rest = self._unread.read()
        self._unread.close()
        return rest, self.err.read_text(errors="replace")


CLI_SERVER = CLIServer()


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` in a process of its own, its output captured, `env` set over this one's."""
    return python(ROOT / "cli.py", *args, cwd=cwd, env={**os.environ, **(env or {})})


def python(
    *argv: str | Path,
    cwd: Path | None = None,
    env: dict[str, str],
    timeout: float = 300,
    address_space: int | None = None,
) -> subprocess.CompletedProcess:
    """`python ARGV` (a script and its arguments, or -m and a module) in a process of its own with the
    environment `env` and at most `address_space` bytes of memory, its output captured: what
    subprocess.run gives. On Linux forked from CLI_SERVER; elsewhere started afresh (macOS's system
    frameworks, which PyTorch loads, are not safe to use in a forked process)."""
    argv = [str(a) for a in argv]
    if sys.platform == "linux":
        return CLI_SERVER.run(argv, Path(cwd or Path.cwd()), dict(env), timeout, address_space)

    def limit() -> None:
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, preexec_fn=limit)  # fmt: skip


def start_cli(*args: str) -> Started | subprocess.Popen:
    """`python cli.py ARGS` started and left running: `start_python`'s."""
    return start_python(ROOT / "cli.py", *args)


def start_python(
    *argv: str | Path, env: dict[str, str] | None = None, merged: bool = False, own_session: bool = False
) -> Started | subprocess.Popen:
    """`python ARGV` started and left running, with the environment `env` (this one's by default), its
    output read as it comes (`stdout`, `read_until`; its errors there too where `merged`), the leader of a
    session of its own where `own_session`, and SIGINT not ignored (a background job's children inherit it
    ignored): on Linux forked from CLI_SERVER, which serves no other command until it has ended; elsewhere
    started afresh."""
    argv, env = [str(a) for a in argv], dict(env or os.environ)
    if sys.platform == "linux":
        return CLI_SERVER.start(argv, Path.cwd(), env, merged=merged, own_session=own_session)
    return subprocess.Popen(
        [sys.executable, *argv], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True, start_new_session=own_session,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def data_flags(dataset) -> list[str]:
    return ["--data-path", str(dataset.data_path), "--tokenizer-path", str(dataset.tokenizer_path)]


def assert_one_line_error(
    result: subprocess.CompletedProcess, *fragments: str, packaged: bool = False
) -> None:
    """The refusal pgolf promises for bad input: a non-zero exit status, no traceback, and exactly one line on
    stderr, `error: ...`, naming every fragment. `packaged`: a packaged script run alone, which also exits
    with status 1, names no cli.py (there is none beside it), keeps the line short (a traceback would print
    its 40 KB encoded source) and stops before its first training step."""
    assert result.returncode != 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    if packaged:
        assert result.returncode == 1 and "cli.py" not in lines[0] and len(lines[0]) < 400, lines[0]
        assert "step:" not in result.stdout


def cli_after(setup: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` in a fresh process that first runs the Python lines `setup` (which replace a
    hook, e.g. to stop the process at one step): the command's own signal handling and exit status."""
    code = f"import sys\n{setup}\nsys.argv = ['cli.py', *{list(args)!r}]\nimport cli\ncli.main()\n"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=os.environ | IMPORTABLE)  # fmt: skip


def read_until(process: Started | subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(
        f"no line starting {prefix!r} in {''.join(lines)}{process.communicate(timeout=60)[1]}"
    )
