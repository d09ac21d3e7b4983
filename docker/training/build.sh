#!/usr/bin/env bash
# Build the multi-node training image from a dscluster wheelhouse.
#   docker/training/build.sh VARIANT WHEELHOUSE [BASE_IMAGE]
# VARIANT is cpu, cuda or gaudi and must match the accelerator the wheelhouse was built for
# (its lock.json). Prints the image tag: dscluster/training:<variant>-<sha12 of sources+lock>.
# Docker's cache keeps the image; an unchanged wheelhouse and Dockerfile rebuild nothing.
set -euo pipefail

die() { echo "docker/training/build.sh: $*" >&2; exit 1; }

[ $# -ge 2 ] || die "usage: build.sh cpu|cuda|gaudi WHEELHOUSE [BASE_IMAGE]"
variant=$1 wheelhouse=$2 base=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
lock=$wheelhouse/lock.json
[ -f "$lock" ] && [ -f "$wheelhouse/requirements.lock" ] \
  || die "$wheelhouse has no lock.json/requirements.lock; run 'dscluster provision' first (it assembles the wheelhouse under ~/.cache/dscluster/wheelhouse)"

read -r accel torch_spec pytag < <(python3 -c '
import json, re, sys
lock = json.load(open(sys.argv[1]))
tag = re.search(r"-(cp3[0-9]+)-", lock.get("key", ""))
print(lock.get("accelerator", "cpu"), lock["torch"], tag.group(1) if tag else "unknown")' "$lock")

case "$variant" in
  cpu)   want=cpu ;;
  cuda)  want=cuda ;;
  gaudi) want=hpu ;;
  *) die "unknown variant '$variant'; use cpu, cuda or gaudi" ;;
esac
[ "$accel" = "$want" ] \
  || die "the wheelhouse $wheelhouse is built for '$accel' ($torch_spec), not for the $variant variant; provision a $variant cluster (or pick that wheelhouse)"

# The default bases' Python must be the one the wheels were built for (a cp313 wheelhouse
# from Debian 13 nodes needs a trixie base; pip would refuse its wheels on bookworm).
need_python() {
  [ "$pytag" = "$1" ] || [ "$pytag" = unknown ] \
    || die "the wheelhouse $wheelhouse is built for Python $pytag, but the default $variant base $base runs $1; pass a BASE_IMAGE with that Python or pick a $1 wheelhouse"
}
if [ -z "$base" ]; then
  case "$variant" in
    cpu)
      case "$pytag" in
        cp313) base=debian:trixie ;;
        *) base=debian:bookworm; need_python cp311 ;;
      esac ;;
    cuda)
      # CUDA user space matching the torch wheel's CUDA (the driver comes from the host).
      case "$torch_spec" in
        *+cu126) base=nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04 ;;
        *+cu128) base=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 ;;
        *+cu130) base=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04 ;;
        *+*) die "no CUDA base image known for $torch_spec; pass BASE_IMAGE" ;;
        # PyPI's own torch (no local label, ml_stack's CUDA default): its CUDA 13.0 build.
        *) base=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04 ;;
      esac
      need_python cp312 ;;
    gaudi)
      synapse=${SYNAPSEAI:-1.21.1}
      torch_version=${torch_spec#torch==}
      base=vault.habana.ai/gaudi-docker/$synapse/ubuntu24.04/habanalabs/pytorch-installer-${torch_version%%+*}:latest ;;
  esac
fi

tag_hash=$( { printf '%s\n' "$variant" "$base"; cat "$here/Dockerfile" "$here/entrypoint.sh" "$here/sshd-training.conf" "$lock"; } | sha256sum | cut -c1-12)
tag=dscluster/training:$variant-$tag_hash
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"; exit 0
fi

# Debian bases come from base-image.sh: present, pulled, or built with debootstrap.
case "$base" in
  debian:*) bash "$here/../base-image.sh" "$base" ;;
esac

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$here/entrypoint.sh" "$here/sshd-training.conf" "$ctx/"
mkdir "$ctx/wheelhouse"
# Only what the lock names: the wheels, requirements.lock and lock.json.
cp -l "$wheelhouse"/*.whl "$wheelhouse/requirements.lock" "$lock" "$ctx/wheelhouse/" 2>/dev/null \
  || cp "$wheelhouse"/*.whl "$wheelhouse/requirements.lock" "$lock" "$ctx/wheelhouse/"
docker build -q --build-arg "BASE_IMAGE=$base" -t "$tag" "$ctx" >/dev/null
echo "$tag"
