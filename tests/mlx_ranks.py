"""Two MLX ranks on this machine, started as `mlx.launch -n 2 --backend ring` starts them: a test helper,
not part of pgolf.

Usage: `python tests/mlx_ranks.py PORT COMMAND...`; the ranks' ring listens on PORT and PORT + 1.

What a rank reads is what mlx.launch gives it: MLX_RANK, and MLX_HOSTFILE, a file listing each rank's
address as JSON. Their output goes to this process's own standard output and error, as mlx.launch merges
it into its own. The difference is the waiting: mlx.launch keeps a thread per rank that polls the rank's
standard input, which is always writable, so it spins about one and a half cores for as long as its ranks
run (docs/distributed.md), on a 2-core machine the time its ranks and the other test worker need. Here the
ranks are waited for. As with mlx.launch, a rank that fails stops the other, and the exit status is
the first failure's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def main(port: int, command: list[str]) -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as hostfile:
        json.dump([[f"127.0.0.1:{port + rank}"] for rank in range(2)], hostfile)
    try:
        ranks = [
            subprocess.Popen(
                command, env={**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": hostfile.name}
            )
            for rank in range(2)
        ]
        while (failed := next((r.returncode for r in ranks if r.poll() not in (None, 0)), 0)) == 0:
            if all(r.returncode == 0 for r in ranks):
                return 0
            time.sleep(0.1)
        for rank in ranks:
            if rank.poll() is None:
                rank.terminate()
            rank.wait()
        return failed if failed > 0 else 128 - failed  # a signal's number as the shell gives it
    finally:
        os.unlink(hostfile.name)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2:]))
