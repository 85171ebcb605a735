"""The test suite's wall time, the machine's busy CPU over it, and where that CPU went (Linux).

    .venv/bin/python bench/suite_cpu.py                  # the whole suite
    .venv/bin/python bench/suite_cpu.py -m "not slow"    # any pytest arguments

It runs `python -m pytest ARGS` and reads /proc/stat before and after: "busy CPU" is every core's time
spent neither idle nor waiting for the disk, so it counts the commands tests/cli_server.py forks, which
`time` leaves out (and anything else the machine ran meanwhile: run it on a quiet machine). A
`sitecustomize` put first on PYTHONPATH records each Python process's own CPU time when it ends (forked
ones too, as they end through `os._exit`), and the table sums them by kind; what is left over is the
C++ compiler building inductor's kernels, processes ended by a signal and the few started with a
PYTHONPATH of their own. docs/tests.md has the figures.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECORDER = """
import atexit, json, os, resource, sys

_out, _exit = os.environ.get("SUITE_CPU_OUT"), os._exit


def _record():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(_out, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[:2], "cpu": usage.ru_utime + usage.ru_stime,
                            "worker": "execnet" in sys.modules}) + "\\n")


def _recorded_exit(code):
    _record()
    _exit(code)


if _out:
    os._exit = _recorded_exit
    atexit.register(_record)
"""


def busy_seconds() -> float:
    """Every core's time neither idle nor in iowait since boot (/proc/stat's first line, in USER_HZ)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def kind(record: dict) -> str:
    argv = record["argv"]
    name = Path(argv[0]).name if argv else ""
    if record["worker"]:  # pytest and pytest-xdist's workers, which run the tests (execnet's processes)
        return "pytest and its workers"
    if name == "cli.py":
        return f"cli.py {argv[1]}" if len(argv) > 1 else "cli.py"
    return name


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "sitecustomize.py").write_text(RECORDER)
        out = Path(folder) / "processes.jsonl"
        path = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
        env = os.environ | {"PYTHONPATH": path, "SUITE_CPU_OUT": str(out)}
        busy, started = busy_seconds(), time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env)
        busy, wall = busy_seconds() - busy, time.monotonic() - started
        last = {}  # a process that exits through os._exit after atexit ran is recorded twice: its last line
        for line in out.read_text().splitlines() if out.exists() else []:
            record = json.loads(line)
            last[record["pid"]] = record
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for record in last.values():
        entry = kinds[kind(record)]
        entry[0] += 1
        entry[1] += record["cpu"]
    recorded = sum(cpu for _, cpu in kinds.values())
    print(f"\nwall {int(wall // 60)}:{wall % 60:04.1f}  busy CPU {busy:,.0f} s on {os.cpu_count()} cores")
    print(f"{'processes':<40} {'count':>6} {'CPU s':>8} {'share':>6}")
    for name, (count, cpu) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        print(f"{name:<40} {count:>6} {cpu:>8.1f} {cpu / busy:>6.1%}")
    rest = busy - recorded
    print(f"{'not in a recorded Python process':<40} {'':>6} {rest:>8.1f} {rest / busy:>6.1%}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
