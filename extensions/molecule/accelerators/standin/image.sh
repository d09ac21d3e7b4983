#!/usr/bin/env bash
# Print the tag of the stand-in repository image, building it only when that tag is missing.
# The tag is a hash of the base image name and every file in this directory, so a change to
# a spec or a build hook gives a new image and warm runs rebuild nothing. The running kernel
# (`uname -r`) is part of it too: the Lustre stand-in builds client modules for it, and the
# node containers share this machine's kernel (helper lustre6).
#   DSCLUSTER_STANDIN_IMAGE=$(bash extensions/molecule/accelerators/standin/image.sh)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
base="${DSCLUSTER_STANDIN_BASE:-debian:bookworm}"
kernel=$(uname -r)
sum=$(
  {
    printf '%s\n' "$base" "$kernel"
    cd "$here"
    find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-12
)
tag="dscluster/standin-repo:$sum"

if ! docker image inspect "$tag" >/dev/null 2>&1; then
  bash "$here/../../../../docker/base-image.sh" "$base"
  echo "[standin] building $tag" >&2
  docker build -q --build-arg "BASE_IMAGE=$base" --build-arg "RUNNING_KERNEL=$kernel" -t "$tag" "$here" >&2
fi
echo "$tag"
