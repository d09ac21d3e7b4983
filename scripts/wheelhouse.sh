#!/usr/bin/env bash
# make wheelhouse: the controller's wheelhouse (torch + DeepSpeed built with its ops) made
# before anything needs it, on a throwaway 1-node local cluster, alone: in `make test` it runs
# beside the unit tests, so the three docker lanes after it do not all wait on one DeepSpeed
# build (a cold build under three lanes outran test_provision's limit).
# A wheelhouse already assembled for the role's torch and DeepSpeed pins is kept: nothing runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
CACHE="${DSCLUSTER_CACHE:-$HOME/.cache/dscluster}"
NAME=wh
pin() { sed -n "s/^$1: \"\(.*\)\"$/\1/p" roles/ml_stack/defaults/main.yml; }
torch=$(pin ml_stack_torch_version)
ds=$(pin ml_stack_deepspeed_version)
[ -n "$torch" ] && [ -n "$ds" ] || { echo "wheelhouse: cannot read the torch/DeepSpeed pins from roles/ml_stack/defaults/main.yml" >&2; exit 1; }
for lock in "$CACHE"/wheelhouse/cpu-torch"$torch"-ds"$ds"-*/lock.json; do
  if [ -f "$lock" ]; then
    echo "wheelhouse: $(dirname "$lock") is assembled (torch $torch, DeepSpeed $ds): nothing to do"
    exit 0
  fi
done
echo "wheelhouse: none for torch $torch + DeepSpeed $ds in $CACHE/wheelhouse: assembling it on a 1-node cluster '$NAME'"
trap '$BIN/dscluster local down --name $NAME >/dev/null 2>&1 || true' EXIT
$BIN/dscluster local down --name "$NAME" >/dev/null 2>&1 || true
start=$(date +%s)
$BIN/dscluster local up --name "$NAME" --nodes 1
mkdir -p "inventories/$NAME/group_vars"
printf -- '---\n# A one-node cluster that only builds the wheelhouse.\nvalidate_inventory_require_workers: false\n' \
  >"inventories/$NAME/group_vars/all.yml"
# The toolchain (base) and ml_stack: the build host compiles DeepSpeed's ops, the controller keeps them.
$BIN/dscluster provision -i "inventories/$NAME" --tags preflight,base,ml_stack
echo "wheelhouse: assembled in $(( $(date +%s) - start )) s"
