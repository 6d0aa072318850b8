#!/usr/bin/env bash
# Fetch the wheels that scripts/gpu_check.sh needs and the lent GPU machine's image lacks (the
# Jupyter stack for tests/nbrun.py, ipywidgets for live mode, mdit-py-plugins for static readings),
# at the versions this project tests with, into the ignored .whl folder that a device call carries:
#   scripts/gpu_wheels.sh                    # for the device's Python 3.12 (into .whl)
#   scripts/gpu_wheels.sh 3.11 .whl-dry      # the same list for this machine's dry run
# No dependencies are resolved (--no-deps): the list below is closed over what the image lacks
# (device tool KINDS.md lists what it has). Left out on purpose: debugpy (ipykernel runs without it),
# widgetsnbextension and jupyterlab_widgets (browser assets; no front end runs there).
set -euo pipefail
PYV=${1:-3.12}
DIR=${2:-.whl}
WHEELS=(
    nbformat==5.11.1 nbclient==0.11.0 jupyter_client==8.10.0 jupyter_core==5.9.1 traitlets==5.16.1
    pyzmq==27.3.0 tornado==6.6.1 ipykernel==7.4.0 comm==0.2.3 nest-asyncio2==1.7.4
    ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 parso==0.8.7
    matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4
    stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 platformdirs==4.14.9
    fastjsonschema==2.22.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
    rpds-py==2026.9.1 ipywidgets==8.1.9 mdit-py-plugins==0.7.0
)
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$tag")
done
mkdir -p "$DIR"
rm -f "$DIR"/*.whl  # one version of each: two stop the install there
${PYTHON:-python3} -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${PLATFORMS[@]}" -d "$DIR" "${WHEELS[@]}"
count=$(ls "$DIR"/*.whl | wc -l)
test "$count" -eq "${#WHEELS[@]}" || { echo "expected ${#WHEELS[@]} wheels in $DIR, found $count" >&2; exit 1; }
# A device call carries the working tree (tracked and untracked files that git does not ignore)
# and the named ignored paths, 64 MiB in all.
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
wheels=$(du -cb "$DIR"/*.whl | tail -n 1 | cut -f1)
echo "$count wheels for Python $PYV in $DIR: $((wheels >> 20)) MiB; with the working tree $(((tree + wheels) >> 20)) MiB of 64"
test $((tree + wheels)) -le $((64 << 20)) || { echo "over the 64 MiB a device call carries" >&2; exit 1; }
