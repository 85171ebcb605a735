"""What the test modules share, by subject; a test module imports these, never another test module.

- backends.py: the backends installed and the `needs(...)` markers, one built, busy weights, a batch, the
  model switches, the frameworks' launchers of two processes, a process where they cannot be imported
- cli.py: `cli(...)`, a CLI command in a process of its own (tests/cli_server.py), the other ways a test
  starts cli.py, and `assert_one_line_error`, the one check of a refusal
- runs.py: `fake_run`, the one run folder written without training; small real runs; a packaged script
  run alone; sweep specs; records folders; audits
- artifacts.py: checkpoints, the int8 and mixed formats' weights, lrzip, small artifacts, the artifact
  fit's run shape and stand-ins
- data.py: the challenge's files, a prepared dataset, a data folder's digest
- fuzz.py: hypothesis's settings, hangs
- ttt.py: test-time training's legal setting and stand-ins
Fixtures are in tests/conftest.py, the independent numpy model in tests/reference.py, the goldens in
tests/golden_data.py.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
PGOLF_PACKAGES = ("core", "cuda_train", "mlx_train")  # pgolf's packages; cli.py beside them
