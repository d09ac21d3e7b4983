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

# (helper lustre6: "AWS FSx stand-in" signs the FSx client repository, "Lustre mirror
# stand-in" the site-signed flat repositories of Whamcloud's client .debs.)
for uid in "NVIDIA CUDA stand-in" "Habana Labs stand-in" "AWS EFA stand-in" \
  "AWS FSx stand-in" "Lustre mirror stand-in"; do
  gpg --batch --quiet --passphrase '' --quick-gen-key "$uid <standin@dscluster.invalid>" ed25519 sign never
done

# ---- helper lustre6: lustre/*/packages.yml are built for the RUNNING kernel of the test
# machine (containers share the host kernel): STANDIN_RUNNING_KERNEL (image.sh passes
# `uname -r` of the machine that builds the image; it is part of the image tag).
export STANDIN_RUNNING_KERNEL="${STANDIN_RUNNING_KERNEL:-$(uname -r)}"
for spec in "$here"/*/packages.yml "$here"/lustre/*/packages.yml; do
  python3 "$here/build_repo.py" "$spec" "$out"
done
printf '%s\n' "$STANDIN_RUNNING_KERNEL" >"$out/RUNNING_KERNEL"
# ---- end helper lustre6 ----

for hook in "$here"/*/build.sh; do
  [ -f "$hook" ] || continue
  echo "[standin] hook $hook" >&2
  bash "$hook" "$out" "$GNUPGHOME"
done

find "$out" -type f | sort | sed "s|^$out/||" >"$out/INDEX"
echo "[standin] $(wc -l <"$out/INDEX") files under $out" >&2
