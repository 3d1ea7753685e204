#!/usr/bin/env bash
# GPU benchmarks: items 1-3 and 5 on CUDA in about ten minutes; item 4 (labs, full profile) on request.
#
#   benchmarks/gpu.sh                 # attention, throughput, quality (plain vs kit recipe), generation
#   benchmarks/gpu.sh --with-labs     # also time every solution notebook in the full profile
#   OUT=/some/dir benchmarks/gpu.sh   # where results go (default benchmarks/results/gpu_<UTC time>)
#
# Writes one JSON file and one log per benchmark plus summary.md (every table, pasteable into
# RESULTS.md). Each step has its own time limit so one slow step cannot eat the others' budget.
# Runs on any CUDA GPU: bf16 where supported, fp16 autocast with a GradScaler otherwise (T4).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-python}"
if [[ -x "$ROOT/.venv/bin/python" && -z "${PYTHON:-}" ]]; then PY="$ROOT/.venv/bin/python"; fi
OUT="${OUT:-$HERE/results/gpu_$(date -u +%Y%m%d_%H%M)}"
WITH_LABS=0
[[ "${1:-}" == "--with-labs" ]] && WITH_LABS=1
mkdir -p "$OUT"
cd "$ROOT" || exit 1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: no CUDA device visible to $PY" >&2
    exit 1
fi
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)" | tee "$OUT/summary.md"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')" | tee -a "$OUT/summary.md"

status=0
step() {  # step NAME LIMIT_SECONDS ARGS...
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout --signal=INT "$limit" "$PY" "$HERE/$name.py" --device cuda --out "$OUT/$name.json" "$@" \
        >"$OUT/$name.log" 2>&1
    local rc=$?
    {
        echo
        echo "## $name (exit $rc, $((SECONDS - t0)) s)"
        grep -E '^\||^target|^issue|: (met|not met)' "$OUT/$name.log" || true
    } | tee -a "$OUT/summary.md"
    [[ $rc -ne 0 ]] && status=1 && tail -n 20 "$OUT/$name.log"
}

# Limits fit an H100/H200-class GPU in ten minutes; a T4 needs longer for the quality runs
# (QUALITY_LIMIT=1200 benchmarks/gpu.sh).
step bench_attention "${ATTENTION_LIMIT:-120}"
step bench_throughput "${THROUGHPUT_LIMIT:-120}"
step bench_quality "${QUALITY_LIMIT:-300}"
step bench_generation "${GENERATION_LIMIT:-60}"
if [[ $WITH_LABS -eq 1 ]]; then
    step bench_labs "${LABS_LIMIT:-1800}" --profile full
fi
echo "results in $OUT"
exit $status
