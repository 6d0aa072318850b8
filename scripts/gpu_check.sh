#!/usr/bin/env bash
# The one prepared device check, for the lent GPU machine's image as it is (device tool KINDS.md):
# its own python3 (3.12, torch 2.11, triton 3.6, transformers 5.17), no Jupyter stack, no network.
# Run from the repository root, with .whl fetched beforehand by scripts/gpu_wheels.sh and carried:
#   OUT=/some/folder scripts/gpu_check.sh          # on the GPU machine (device run: carry .whl)
#   scripts/gpu_check.sh --dry-run                 # the same steps on this CPU (make test-gpu-dry)
# A device call from the main checkout: scripts/gpu_wheels.sh there first, then
#   run(command="OUT=$OUT scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
# and commit $OUT's <gpu>-<date>.json under book/data/measurements/.
# The dry run uses the venv made to look like the image (.venv-device, scripts/device-image.txt) and
# the same wheels for its Python (.whl-dry); it skips only the GPU-only measurement (record), and
# runs the tests and the notebooks at CPU sizes: one static notebook instead of four, test
# collection plus the widget tests instead of the whole suite.
#
# Writes under $OUT, at most 3 files (a device call returns at most 8): summary.txt (one line per
# step, written as each step ends), gpu-check.tar.gz (every log, the executed notebooks, their
# timings, the live slider's record; repacked after every step, so a step that runs out or a
# killed call still leaves what was measured), and <gpu>-<date>.json (the bench record, for
# book/data/measurements/).
#
# Time limits (seconds; each step is killed at its limit and the next one runs), from the dry run
# measured on the loaded 2-core CPU (2026-12-01, beside the floor suite): wheels 12 s, env 32 s,
# tests 54 s (collection of 1,168 tests 23 s, widget tests 9 s), diagnose at CPU sizes 45 s, static
# notebook 01 98 s, live notebook 01 with its slider 47 s (the slider's re-measure 0.3 s). GPU
# factors, stated since no GPU run exists yet: x2 for the wheels (the same pip work, cold disk); x1
# for env (CPU calibration here, CUDA start-up there); x1 for the static notebooks (four side by
# side on 16 cores; kernel start and imports dominate, the GPU sizes run on the GPU); x1.5 for the
# live notebook. The tests, record and diagnose steps do GPU-only work that the dry run cannot
# time; they keep the budget they were sized to:
#   wheels 25 + env 30 + tests 110 + record 100 + diagnose 45 + static notebooks 100 + live 70
#   = 480 s at most, within the 8 minutes the check may take on one H200.
set -uo pipefail
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
PY=${PYTHON:-python3}
WHEELS=${KVLAB_WHEELS:-.whl}
if ((DRY)); then
    OUT=${OUT:-$(mktemp -d /tmp/kvlab-gpu-dry.XXXXXX)}
else
    OUT=${OUT:-book/data/measurements}
fi
WORK=$(mktemp -d /tmp/kvlab-gpu-check.XXXXXX)
SITE=$WORK/site
mkdir -p "$OUT" "$WORK/notebooks"
: > "$OUT/summary.txt"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$PWD:$SITE" JUPYTER_RUNTIME_DIR="$WORK/jupyter-runtime" KVLAB_SLIDER_OUT="$WORK/live-slider.json"
if ((DRY)); then
    export TRITON_INTERPRET=1
    name=cpu-dry-run
    # Triton 3.6's interpreter (the image's) fails on 05b's kernels where 3.9's passes: the dry run
    # executes pages without kernels; on the GPU the kernels compile instead.
    static_notebooks=(10_memory_wall)
    live_notebook=10_memory_wall
else
    export TRITON_INTERPRET=0
    name=$($PY -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '-').lower())" 2>/dev/null || echo unknown-gpu)
    # Not 01, 06, 08, 09 or 11: they load the pretrained model, whose 93 MB wheel exceeds what travels.
    static_notebooks=(02_cache_reuse 04_kv_layout 05_paged_attention 05b_paged_kernel)
    live_notebook=05b_paged_kernel
fi
day=$(date +%Y-%m-%d)
failed=0

step() {  # step LABEL GPU_LIMIT DRY_LIMIT COMMAND...: run with a time limit, log it, record its exit
    local label=$1 limit=$2
    ((DRY)) && limit=$3
    shift 3
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" > "$WORK/$label.log" 2>&1
    local rc=$?
    local line="$label: exit $rc in $((SECONDS - start)) s (limit $limit s)"
    ((rc == 124 || rc == 137)) && line+=" TIMED OUT"
    ((rc != 0)) && failed=1
    echo "$line" | tee -a "$OUT/summary.txt"
    tail -n 3 "$WORK/$label.log" | sed 's/^/    /'
    tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" --exclude=site --exclude=jupyter-runtime . 2>/dev/null
}

# The image has no Jupyter stack: the carried wheels go into a folder of their own on PYTHONPATH
# (the device tool's way: pip --target, no index, no dependencies resolved).
if ((DRY)) && $PY -c "import nbclient" 2>/dev/null; then
    echo "dry run: $PY already has nbclient, so it does not look like the device image" | tee -a "$OUT/summary.txt"
    exit 1
fi
step wheels 25 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
step env 30 120 bash -c "$PY -m kvlab env && $PY -c 'import nbclient, ipykernel, ipywidgets, mdit_py_plugins'"
# The notebooks run below; the ahead-of-time compile and the fresh-venv install tests need no GPU,
# nor do tests/parallel (CPU ranks on gloo; they start processes for minutes).
# Collection never fails: test files that need a browser or Jupyter skip where those are missing.
if ((DRY)); then
    step tests 110 300 bash -c "$PY -m pytest tests -q -p no:cacheprovider --collect-only >$WORK/collect.txt \
        && tail -n 1 $WORK/collect.txt && $PY -m pytest -q -p no:cacheprovider -rs tests/show/test_widgets.py"
else
    step tests 110 300 $PY -m pytest tests -q -p no:cacheprovider -rs -n 8 --dist loadfile --maxfail=20 \
        --durations=15 -m "not notebook" --ignore=tests/kernels/test_targets.py --ignore=tests/test_install.py \
        --ignore=tests/parallel
fi
if ((DRY)); then
    echo "record: skipped in the dry run (the GPU-only measurement)" | tee -a "$OUT/summary.txt"
else
    step record 100 0 $PY -m kvlab record "$WORK/$name-$day.json"
    cp "$WORK/$name-$day.json" "$OUT/" 2>/dev/null
fi
# Section 9.8: the cached and static step traces that notebook 09 draws beside the reader's own.
if ((DRY)); then
    step diagnose 45 300 $PY -m kvlab diagnose --size cpu --context 16 --new-tokens 4 \
        --save-traces "$WORK/$name-$day-diagnose-traces.json"
else
    step diagnose 45 300 $PY -m kvlab diagnose --context 1024 --save-traces "$WORK/$name-$day-diagnose-traces.json"
fi
# The static notebooks at their GPU sizes, side by side (16 cores); each has its own limit inside
# the step's, so a stalled one still writes its record naming the cell (tests/nbrun.py).
step static-notebooks 100 300 bash -c 'pids=(); for nb in "$@"; do
        '"$PY"' tests/nbrun.py "notebooks/$nb.ipynb" --out "'"$WORK"'/notebooks/static" --limit '"$((DRY ? 280 : 90))"' & pids+=($!)
    done; rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc' _ "${static_notebooks[@]}"
# The live GPU reader's path: one notebook (05b, the paged kernel, on the GPU) without KVLAB_STATIC, then one of its sliders moved through
# the widget's own callback and the re-measured figure and reading timed (scripts/slider_check.py).
step live-notebook 70 300 $PY tests/nbrun.py "notebooks/$live_notebook.ipynb" --live --out "$WORK/notebooks/live" \
    --limit "$((DRY ? 280 : 60))" --after-file scripts/slider_check.py
cat "$KVLAB_SLIDER_OUT" 2>/dev/null | tee -a "$OUT/summary.txt"
echo "results: $OUT/summary.txt, $OUT/gpu-check.tar.gz" | tee -a "$OUT/summary.txt"
rm -rf "$WORK"
exit $failed
