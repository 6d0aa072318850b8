#!/usr/bin/env bash
# The one prepared device check, sized for a lent GPU machine: under 8 minutes on one H200.
# Run from the repository root on a CUDA machine whose Python has requirements.txt installed:
#   OUT=/some/folder scripts/gpu_check.sh
# It writes under $OUT: env.txt; gpu-tests.log (the test suite on the GPU, kernels compiled, bf16
# included); the record <gpu>-<date>.json (for book/data/measurements/) with bench.txt, its table; and
# the diagnose step traces (notebook 09); the executed notebooks 01, 02, 05 and 05b at their GPU
# sizes. Each step has its own time limit
# (30 + 90 + 110 + 50 + 4 x 45 s = 460 s at most, plus start-up; never yet run on a GPU, so the
# split between the steps is an estimate), and a step that runs out is reported
# and the next one runs.
set -uo pipefail
OUT=${OUT:-book/data/measurements}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TRITON_INTERPRET=0
name=$($PY -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-').lower())")
day=$(date +%Y-%m-%d)
status=()

step() {  # step LABEL SECONDS COMMAND...: run with a time limit, keep its exit code
    local label=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    status+=("$label: exit $rc in $((SECONDS - start)) s (limit $limit s)")
}

step env 30 bash -c "$PY -m kvlab env | tee '$OUT/env.txt'"
# The notebooks run below; the ahead-of-time compile and the fresh-venv install tests need no GPU,
# nor do tests/parallel (CPU ranks on gloo; they start processes for minutes).
step tests 90 bash -c "$PY -m pytest tests -q -p no:cacheprovider -rs -x --ignore=tests/test_notebooks.py \
    --ignore=tests/test_kernel_targets.py --ignore=tests/test_install.py --ignore=tests/parallel 2>&1 | tee '$OUT/gpu-tests.log'; exit \${PIPESTATUS[0]}"
step record 110 bash -c "$PY -m kvlab record '$OUT/$name-$day.json' 2>&1 | tee '$OUT/bench.txt'; exit \${PIPESTATUS[0]}"
# Section 9.8: the cached and static step traces that notebook 09 draws beside the reader's own.
step diagnose 50 bash -c "$PY -m kvlab diagnose --context 1024 --save-traces '$OUT/$name-$day-diagnose-traces.json' 2>&1 \
    | tee '$OUT/diagnose.txt'; exit \${PIPESTATUS[0]}"
for nb in 01_decode_loop 02_cache_reuse 05_paged_attention 05b_paged_kernel; do
    step "$nb" 45 env KVLAB_STATIC=1 $PY - "$nb" "$OUT" <<'PYEOF'
import sys, time
import nbformat
from nbclient import NotebookClient

name, out = sys.argv[1], sys.argv[2]
nb = nbformat.read(f"notebooks/{name}.ipynb", as_version=4)
start = time.perf_counter()
try:
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
finally:
    nbformat.write(nb, f"{out}/{name}.ipynb")  # executed (or as far as it got), outputs kept
    print(f"{name}: {time.perf_counter() - start:.0f} s")
PYEOF
done
printf '%s\n' "${status[@]}" | tee "$OUT/summary.txt"
