#!/usr/bin/env bash
# Build the stand-in vendor repositories into OUTDIR (default /srv/standin):
#   1. one signing key per vendor (gpg batch mode, no passphrase) in a private GNUPGHOME;
#   2. the apt repositories of */packages.yml (build_repo.py: dpkg-deb, apt-ftparchive,
#      Release signed as Release.gpg and InRelease);
#   3. every vendor hook */build.sh OUTDIR GNUPGHOME (e.g. efa/build.sh writes the EFA
#      installer tarball, its sha256 and signature, signed with --local-user "AWS EFA stand-in").
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out="${1:-/srv/standin}"
mkdir -p "$out"
export GNUPGHOME="${GNUPGHOME:-$(mktemp -d)}"
chmod 0700 "$GNUPGHOME"

for uid in "NVIDIA CUDA stand-in" "Habana Labs stand-in" "AWS EFA stand-in"; do
  gpg --batch --quiet --passphrase '' --quick-gen-key "$uid <standin@dscluster.invalid>" ed25519 sign never
done

for spec in "$here"/*/packages.yml; do
  python3 "$here/build_repo.py" "$spec" "$out"
done

for hook in "$here"/*/build.sh; do
  [ -f "$hook" ] || continue
  echo "[standin] hook $hook" >&2
  bash "$hook" "$out" "$GNUPGHOME"
done

find "$out" -type f | sort | sed "s|^$out/||" >"$out/INDEX"
echo "[standin] $(wc -l <"$out/INDEX") files under $out" >&2
