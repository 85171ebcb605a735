"""The artifact fit's settings shared by two ranks (core/train/fitting.py's `shared_fit`): a test helper,
not part of pgolf.

tests/test_fit_runs.py runs `<launcher> tests/torchrun_fit.py BACKEND MODE SECONDS TIMEOUT OUT` with two
processes: the collectives time out after TIMEOUT seconds (PyTorch); rank 0's fit takes SECONDS, then
chooses settings (MODE "chooses") or raises (MODE "fails"). After one more sum over the ranks (the job
still works), each rank writes one line to OUT/rank<r>: its settings as JSON or `error: <message>`
(a file each: the ranks' standard outputs interleave).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # instead of tests/

import numpy as np  # noqa: E402

from cli import exit_now  # noqa: E402
from core.artifact.fit import FIT_FIELDS  # noqa: E402
from core.common.errors import PgolfError  # noqa: E402
from core.config.presets import preset  # noqa: E402
from core.model import backend as backends  # noqa: E402
from core.train.fitting import shared_fit  # noqa: E402

CHOSEN = {"quant_format": "mixed", "embed_bits": 7, "mlp_clip_sigmas": 10.0, "compressor": "lzma",
          "lqer_enabled": True, "lqer_top_k": 5, "lqer_rank": 8}  # fmt: skip


def main(name: str, mode: str, seconds: float, timeout: float, out: Path) -> None:
    cfg = preset("smoke").replace(collective_timeout_seconds=timeout, artifact_fit_bytes=100_000)
    backend = backends.create(name, cfg)

    def fit() -> SimpleNamespace:
        time.sleep(seconds)
        if mode == "fails":
            raise PgolfError("injected fit failure")
        return SimpleNamespace(cfg=cfg.replace(**CHOSEN, artifact_fit_bytes=0))

    try:
        got, _ = shared_fit(backend, cfg, fit)
        line = json.dumps({k: getattr(got, k) for k in FIT_FIELDS} | {"fit_bytes": got.artifact_fit_bytes})
    except PgolfError as exc:
        line = f"error: {exc}"
    backend.all_reduce_sum(np.ones(1))
    (out / f"rank{backend.rank}").write_text(line)
    backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
    exit_now(0)
