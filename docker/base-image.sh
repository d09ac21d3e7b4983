#!/usr/bin/env bash
# Provide the base image (default debian:bookworm): reuse it when present, pull it when a
# registry answers, otherwise build it with debootstrap from the host's apt mirror and
# `docker import` it. Real users pull; air-gapped and registry-less machines build.
set -euo pipefail

image="${1:-debian:bookworm}"
suite="${image#*:}"
log() { printf '[base-image] %s\n' "$*" >&2; }

if docker image inspect "$image" >/dev/null 2>&1; then
  log "$image present"
  exit 0
fi

if timeout 60 docker pull "$image" >/dev/null 2>&1; then
  log "pulled $image"
  exit 0
fi
log "no registry answered for $image; building it with debootstrap"

if ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "debootstrap is missing; install it (sudo apt-get install debootstrap) and re-run"
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

# The mirror the host itself uses (deb822 or one-line sources), else Debian's default.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ {print $2; exit}' "$f")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
fi
mirror="${mirror:-http://deb.debian.org/debian}"

# Release files are checked against Debian's archive keys, whatever the mirror's scheme.
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -s "$keyring" ]; then
  log "$keyring is missing; install it (apt-get install debian-archive-keyring) and re-run"
  exit 1
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/dscluster-rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
log "debootstrap --variant=minbase $suite from $mirror"
debootstrap --variant=minbase --keyring="$keyring" "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2
  log "debootstrap failed (full log: $root.log)"
  exit 1
}
rm -f "$root.log"
# Same apt sources inside the image as debootstrap used.
printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" \
  >"$root/etc/apt/sources.list"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
log "built $image with debootstrap"
