#!/usr/bin/env bash
# Prepare `.carry/` for a run of benchmarks/gpu.sh on a lent GPU machine (run this HERE, online).
#
# Such a machine has its own python3 with torch, lightning, torchmetrics, numpy, matplotlib and
# PyYAML, but it cannot reach the internet and the checkout's ../shared does not travel. What the
# kit needs beyond that image goes into `.carry/` (git-ignored, about 1.5 MB), which the device
# call names in `carry`:
#   .carry/wheels/  jsonargparse and its signature extras (LightningCLI needs them), as
#                   pure-Python wheels for the machine's Python (3.12 by default: PY_VERSION=3.x)
#   .carry/data/    tinyshakespeare.txt, checked against the kit's SHA-256
# gpu.sh installs the wheels into a temporary folder and points the benchmarks at the data.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
CARRY="$ROOT/.carry"
DATA="${TRANSFORMER_LAB_TINY_SHAKESPEARE:-$ROOT/../shared/data/tinyshakespeare.txt}"
# Pure-Python packages the kit needs that the GPU image lacks (KINDS.md lists what it has).
PACKAGES=(jsonargparse docstring-parser typeshed-client)

rm -rf "$CARRY/wheels"
mkdir -p "$CARRY/wheels" "$CARRY/data"
for package in "${PACKAGES[@]}"; do
    # The version installed here is the one the tests ran with.
    version="$("$PY" -m pip show "$package" 2>/dev/null | sed -n 's/^Version: //p')"
    spec="$package${version:+==$version}"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
        --implementation py --abi none --platform any -d "$CARRY/wheels" "$spec"
done
"$PY" - "$DATA" "$CARRY/data/tinyshakespeare.txt" <<'EOF'
import hashlib, shutil, sys
from transformer_lab.data.corpus import TINY_SHAKESPEARE_SHA256
source, target = sys.argv[1], sys.argv[2]
digest = hashlib.sha256(open(source, "rb").read()).hexdigest()
if digest != TINY_SHAKESPEARE_SHA256:
    sys.exit(f"{source}: sha256 {digest} is not the expected {TINY_SHAKESPEARE_SHA256}")
shutil.copyfile(source, target)
EOF
ls -l "$CARRY/wheels" "$CARRY/data"
du -sh "$CARRY"
echo "next, with the device tool: run(command='BUNDLE_TO=\$OUT bash benchmarks/gpu.sh', carry=['.carry'])"
