#!/usr/bin/env bash
# The one prepared device check (run on a CUDA machine from the repository root):
# the test suite on the GPU, `python -m kvlab bench`, and `python -m kvlab record` into $OUT.
# Locally: OUT=book/data/measurements scripts/gpu_check.sh
set -uo pipefail
OUT=${OUT:-book/data/measurements}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
name=$($PY -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-').lower())")
day=$(date +%Y-%m-%d)

$PY -m kvlab env | tee "$OUT/env.txt"
# Kernels compiled for the GPU (no interpreter), bf16 included; notebooks are the book build's job.
TRITON_INTERPRET=0 timeout 300 $PY -m pytest tests -q -p no:cacheprovider -rs \
    --ignore=tests/test_notebooks.py 2>&1 | tee "$OUT/gpu-tests.log"
tests=${PIPESTATUS[0]}
timeout 240 $PY -m kvlab record "$OUT/$name-$day.json" 2>&1 | tee "$OUT/bench.txt"
# Section 9.8: the cached and static step traces that notebook 09 draws beside the reader's own.
timeout 120 $PY -m kvlab diagnose --context 1024 --save-traces "$OUT/$name-$day-diagnose-traces.json" 2>&1 \
    | tee "$OUT/diagnose.txt"
echo "tests exit $tests"
