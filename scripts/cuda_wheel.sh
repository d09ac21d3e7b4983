#!/usr/bin/env bash
# make cuda-wheel: DeepSpeed's wheel with its CUDA ops pre-built (the cuda list of
# ml_stack_deepspeed_prebuilt_ops) for ml_stack_cuda_arch_list, without a GPU, in a node
# container (Debian 12, Python 3.11) with no network. The compiler is PyPI's CUDA wheels of the
# CUDA release PyPI's torch is built with (ml_stack_pypi_torch_cuda), hash-locked in
# roles/ml_stack/files/locks/cuda-build-tools-<cuda>-x86_64.txt and installed into the build
# venv only: its nvidia/cu13 directory is the CUDA_HOME. Every file is downloaded on the
# controller against the locks' sha256 into $DSCLUSTER_CACHE/cuda-build/ (kept between runs);
# the wheel, the build's time and the check's JSON report go to $DSCLUSTER_CACHE/cuda-build/out/.
# The check (scripts/wheel_ops.py) fails the target when an op asked for is missing or lacks a
# cubin for an architecture of the list. Not part of `make test`: about 2.6 GB of wheels and a
# compile of several minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
CACHE="${DSCLUSTER_CACHE:-$HOME/.cache/dscluster}"
WORK="$CACHE/cuda-build"
# The node image is Debian 12: CPython 3.11.
PY_TAG=cp311

# The role's pins; the nested op map through YAML, not sed.
torch='' ds='' cuda='' arch_list='' ops='' ds_build=''
eval "$($BIN/python - roles/ml_stack/defaults/main.yml <<'EOF'
import shlex
import sys

import yaml

with open(sys.argv[1]) as f:
    d = yaml.safe_load(f)
ops = d["ml_stack_deepspeed_prebuilt_ops"]["cuda"]
for name, value in {
    "torch": d["ml_stack_torch_version"],
    "ds": d["ml_stack_deepspeed_version"],
    "cuda": d["ml_stack_pypi_torch_cuda"],
    "arch_list": d["ml_stack_cuda_arch_list"],
    "ops": ",".join(ops),
    "ds_build": " ".join(f"{var}=1" for var in ops.values()),
}.items():
    print(f"{name}={shlex.quote(str(value))}")
EOF
)"
for pin in "$torch" "$ds" "$cuda" "$arch_list" "$ds_build"; do
  [ -n "$pin" ] || { echo "cuda-wheel: cannot read the pins from roles/ml_stack/defaults/main.yml" >&2; exit 1; }
done
torch_lock="roles/ml_stack/files/locks/pypi-torch$torch-ds$ds-$PY_TAG-x86_64.txt"
tools_lock="roles/ml_stack/files/locks/cuda-build-tools-$cuda-x86_64.txt"
for lock in "$torch_lock" "$tools_lock"; do
  [ -f "$lock" ] || { echo "cuda-wheel: no lock $lock for the role's pins" >&2; exit 1; }
done
echo "cuda-wheel: DeepSpeed $ds for torch $torch (CUDA $cuda), ops $ops, TORCH_CUDA_ARCH_LIST=\"$arch_list\""

# The locks split: wheels (the torch lock without DeepSpeed, and the compiler) and DeepSpeed's
# sdist, the only file built.
mkdir -p "$WORK/wheels" "$WORK/locks" "$WORK/out"
awk '/^deepspeed==/ {p = 1} !p {print} p && !/\\$/ {p = 0}' "$torch_lock" >"$WORK/locks/torch.txt"
awk '/^deepspeed==/ {p = 1} p {print} p && !/\\$/ {exit}' "$torch_lock" >"$WORK/locks/deepspeed.txt"
grep -q '^deepspeed==' "$WORK/locks/deepspeed.txt" || { echo "cuda-wheel: no deepspeed line in $torch_lock" >&2; exit 1; }
cp "$tools_lock" "$WORK/locks/tools.txt"

# Every manylinux tag a glibc 2.28 x86_64 node takes: the files pip picks are the node's, not
# the controller's.
platforms=(--platform linux_x86_64 --platform manylinux1_x86_64 --platform manylinux2010_x86_64
           --platform manylinux2014_x86_64)
for v in $(seq 5 28); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
start=$(date +%s)
for lock in torch tools; do
  $BIN/pip download --quiet --disable-pip-version-check --require-hashes --no-deps \
    --only-binary :all: --python-version 3.11 --implementation cp --abi "$PY_TAG" "${platforms[@]}" \
    --dest "$WORK/wheels" -r "$WORK/locks/$lock.txt"
done
$BIN/pip download --quiet --disable-pip-version-check --require-hashes --no-deps \
  --no-binary :all: --dest "$WORK/wheels" -r "$WORK/locks/deepspeed.txt"
echo "cuda-wheel: $(du -sh "$WORK/wheels" | cut -f1) of hash-checked files in $WORK/wheels ($(( $(date +%s) - start )) s)"

# The node image plus Debian's compiler, libaio (async_io) and Python headers: an image of its
# own, cached by Docker under a tag of its inputs.
node=$($BIN/dscluster image)
dockerfile="FROM $node
RUN apt-get update \\
 && apt-get install -y --no-install-recommends g++ gcc libaio-dev libc6-dev make python3-dev python3-venv time \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && useradd --create-home --uid 1000 builder"
image="dscluster/cuda-build:$(printf '%s' "$dockerfile" | sha256sum | cut -c1-12)"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  echo "cuda-wheel: building $image (on $node)"
  printf '%s\n' "$dockerfile" | docker build -q -t "$image" - >/dev/null
fi

# The build runs as the image's builder (uid 1000); the output directory is handed to it for
# the run and back to the caller after.
rm -f "$WORK"/out/deepspeed-*.whl "$WORK"/out/{wheel_ops.json,build-time.txt,build.log}
owner="$(id -u):$(id -g)"
chown 1000:1000 "$WORK/out" 2>/dev/null || chmod 0777 "$WORK/out"
restore() { chown -R "$owner" "$WORK/out" 2>/dev/null || true; chmod 0755 "$WORK/out"; }
trap restore EXIT
echo "cuda-wheel: building in $image, no network, MAX_JOBS=$(nproc)"
rc=0
docker run --rm -i --network none --user builder --entrypoint bash \
  -v "$WORK/wheels:/wheels:ro" -v "$WORK/locks:/locks:ro" -v "$PWD/scripts:/scripts:ro" \
  -v "$WORK/out:/out" \
  -e "ARCH_LIST=$arch_list" -e "OPS=$ops" -e "DS_BUILD=$ds_build" \
  "$image" -s <<'EOF' || rc=$?
set -euo pipefail
cd /tmp
t0=$(date +%s)
python3 -m venv /tmp/venv
export PATH=/tmp/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
for lock in torch tools; do
  pip install --quiet --no-index --find-links /wheels --require-hashes --no-deps -r /locks/$lock.txt
done
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export CUDA_HOME=$site/nvidia/cu13
# nvcc links against libcudart.so; the runtime wheel ships only the soname.
ln -sf libcudart.so.13 "$CUDA_HOME/lib/libcudart.so"
export PATH=$CUDA_HOME/bin:$PATH
# async_io links -lcuda, the driver's library: a host with no GPU driver has none and PyPI's
# wheels ship no stub. An empty libcuda.so.1 stands in at link time, as the toolkit's
# stubs/libcuda.so does; a CUDA node's driver provides the real one when the op loads.
mkdir -p /tmp/stubs
gcc -shared -Wl,-soname,libcuda.so.1 -o /tmp/stubs/libcuda.so -x c /dev/null
export LIBRARY_PATH=/tmp/stubs
echo "cuda-wheel: build venv in $(( $(date +%s) - t0 )) s; $(nvcc --version | tail -2 | head -1)"
# DS_ACCELERATOR=cuda: with no GPU DeepSpeed would otherwise take its CPU accelerator and build
# the CPU ops under the CUDA ops' names.
# shellcheck disable=SC2086  # DS_BUILD is a list of VAR=1 words
/usr/bin/time -v -o /out/build-time.txt \
  env DS_ACCELERATOR=cuda DS_BUILD_OPS=0 $DS_BUILD TORCH_CUDA_ARCH_LIST="$ARCH_LIST" \
    DS_ENABLE_NINJA=1 MAX_JOBS="$(nproc)" \
  pip wheel --verbose --no-build-isolation --no-deps --no-index --find-links /wheels \
    --require-hashes --wheel-dir /out -r /locks/deepspeed.txt >/out/build.log 2>&1 \
  || { tail -40 /out/build.log; echo "cuda-wheel: the build failed (its log: build.log in the output directory)"; exit 1; }
grep -E 'Elapsed|User time|System time|Maximum resident' /out/build-time.txt | sed 's/^\s*/cuda-wheel: build /'
wheel=$(ls /out/deepspeed-*.whl)
echo "cuda-wheel: $(basename "$wheel"), $(du -h "$wheel" | cut -f1)"
python /scripts/wheel_ops.py "$wheel" --cuobjdump "$CUDA_HOME/bin/cuobjdump" \
  --want-ops "$OPS" --want-arch "$ARCH_LIST" --want-accelerator cuda --json /out/wheel_ops.json
EOF
[ "$rc" -eq 0 ] || { echo "cuda-wheel: failed (exit $rc); see above" >&2; exit "$rc"; }
echo "cuda-wheel: $(ls "$WORK"/out/deepspeed-*.whl) and $WORK/out/wheel_ops.json"
