#!/usr/bin/env bash
# One command to set up transformer-lab on a fresh machine:
#   ./setup.sh
# creates .venv/, installs PyTorch first (so nothing else drags in a different build),
# then the kit with its grading and developer tools, and registers a Jupyter kernel.
# Override the interpreter with PYTHON=python3.12 and the torch requirement with
# TORCH_SPEC='torch>=2.1' (default: the release this kit is tested against).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

"$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
.venv/bin/transformer-lab info
command -v bwrap >/dev/null 2>&1 || echo "note: bubblewrap is missing: 'labs grade' refuses and its tests skip until you run 'sudo apt-get install bubblewrap' (Debian/Ubuntu; docs/grading.md for macOS and Windows)"
echo "transformer-lab is ready: activate with 'source .venv/bin/activate'"
