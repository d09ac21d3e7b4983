#!/bin/bash
# Stand-in for the AWS EFA installer, built by the accelerators scenario's repo image.
#
#   build.sh OUTDIR GNUPGHOME
#
# Writes OUTDIR/efa/aws-efa-installer-<VER>.tar.gz, its detached signature (.tar.gz.sig, made
# with the "AWS EFA stand-in" key of GNUPGHOME) and that public key (aws-efa-installer.key):
# the three files AWS publishes at https://efa-installer.amazonaws.com. The tarball has the
# real one's shape: aws-efa-installer/{efa_installer.sh,env.sh,package_list.txt} and
# DEBS/DEBIAN12/<arch>/ with stand-in .debs under the real package names. The packages hold
# no drivers and no libfabric: fi_info reports what a host without EFA devices reports, and
# refuses to guess when devices are present. The efa role's tests point efa_installer_url at
# the served directory; everything else (sha256, signature, fingerprint pin, the installer's
# flags, its installed-packages record) runs as it does against AWS.
set -euo pipefail

OUT=${1:?usage: build.sh OUTDIR GNUPGHOME}
export GNUPGHOME=${2:?usage: build.sh OUTDIR GNUPGHOME}
UID_NAME="AWS EFA stand-in"

# Installer release mirrored here, and the component versions its changelog lists
# (aws-parallelcluster-cookbook, "Upgrade EFA installer to 1.41.0": efa-2.15.0-1,
# efa-config-1.18-1, efa-profile-1.7-1, libfabric-aws-2.1.0-1, rdma-core-57.0-1).
VER=1.41.0
LIBFABRIC=2.1.0amzn1.0
EFA_CONFIG=1.18
EFA_PROFILE=1.7
RDMA_CORE=57.0-1
EFA_DRIVER=2.15.0-1
OFI_NCCL=1.14.0-1
ARCH=$(dpkg --print-architecture)
case "$ARCH" in amd64) MARCH=x86_64 ;; arm64) MARCH=aarch64 ;; *) MARCH=$ARCH ;; esac

# Reproducible: fixed mtimes and no gzip timestamp, so one source gives one sha256.
export SOURCE_DATE_EPOCH=1735689600
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
top=$work/aws-efa-installer
debs=DEBS/DEBIAN12/$MARCH
mkdir -p "$top/$debs/rdma-core" "$top/$debs/efa-driver"

# deb NAME VERSION ARCH DEPENDS DESCRIPTION SUBDIR: builds from the tree at $work/root/NAME.
deb() {
  local name=$1 version=$2 arch=$3 depends=$4 desc=$5 sub=$6 root=$work/root/$1
  mkdir -p "$root/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: dscluster test stand-in <root@localhost>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Section: misc"
    echo "Priority: optional"
    echo "Description: $desc (dscluster stand-in)"
    echo " Stand-in with the real package's name and paths; holds no driver or library code."
  } >"$root/DEBIAN/control"
  local file=${name}_${version}_${arch}.deb
  find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  dpkg-deb --root-owner-group -Zgzip --build "$root" "$top/$debs/$sub$file" >/dev/null
  echo "$debs/$sub$file" >>"$top/package_list.txt"
}

# ---- libfabric (under /opt/amazon/efa, as the real libfabric1-aws / libfabric-aws-bin) ----
r=$work/root/libfabric1-aws
mkdir -p "$r/opt/amazon/efa/lib"
printf 'stand-in for libfabric %s (no provider code)\n' "$LIBFABRIC" >"$r/opt/amazon/efa/lib/libfabric.so.1.stand-in"
printf '%s\n' "$LIBFABRIC" >"$r/opt/amazon/efa/lib/libfabric.version"
deb libfabric1-aws "$LIBFABRIC" "$ARCH" "" "libfabric with the AWS EFA provider" ""

r=$work/root/libfabric-aws-bin
mkdir -p "$r/opt/amazon/efa/bin"
cat >"$r/opt/amazon/efa/bin/fi_info" <<FI
#!/bin/sh
# Stand-in fi_info: answers like the real one on a host with no EFA device, and refuses to
# answer (exit 2) where EFA devices exist, because it cannot query them.
VERSION="$LIBFABRIC"
FI
cat >>"$r/opt/amazon/efa/bin/fi_info" <<'FI'
case "${1:-}" in
  --version)
    printf 'fi_info: %s\nlibfabric: %s\nlibfabric api: %s\n' "$VERSION" "$VERSION" "${VERSION%%amzn*}" | sed 's/\(api: [0-9]*\.[0-9]*\)\.[0-9]*/\1/'
    exit 0 ;;
esac
for dev in /sys/class/infiniband/*; do
  case "$dev" in
    *efa*) echo "fi_info (dscluster stand-in): EFA device $(basename "$dev") present; this stand-in cannot query it, install the real EFA software" >&2
           exit 2 ;;
  esac
done
echo "fi_getinfo: -61 (No data available)" >&2
exit 61
FI
chmod 0755 "$r/opt/amazon/efa/bin/fi_info"
deb libfabric-aws-bin "$LIBFABRIC" "$ARCH" "libfabric1-aws (= $LIBFABRIC)" "libfabric utilities (fi_info)" ""

# ---- configuration and profile ----
r=$work/root/efa-config
mkdir -p "$r/etc/udev/rules.d"
echo '# stand-in: the real efa-config sets EFA device permissions here' >"$r/etc/udev/rules.d/60-efa.rules"
deb efa-config "$EFA_CONFIG" all "" "EFA configuration (udev rules, limits)" ""

r=$work/root/efa-profile
mkdir -p "$r/etc/profile.d" "$r/etc/ld.so.conf.d"
echo 'PATH=$PATH:/opt/amazon/efa/bin' >"$r/etc/profile.d/zippy_efa.sh"
echo '/opt/amazon/efa/lib' >"$r/etc/ld.so.conf.d/000_efa.conf"
deb efa-profile "$EFA_PROFILE" all "" "EFA profile (PATH and ld.so.conf entries)" ""

# ---- aws-ofi-nccl (NCCL's net plugin, under /opt/amazon/ofi-nccl) ----
r=$work/root/libnccl-ofi
mkdir -p "$r/opt/amazon/ofi-nccl/lib"
printf 'stand-in for aws-ofi-nccl %s\n' "$OFI_NCCL" >"$r/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
printf 'stand-in for aws-ofi-nccl %s tuner\n' "$OFI_NCCL" >"$r/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so"
ln -s libnccl-net-ofi.so "$r/opt/amazon/ofi-nccl/lib/libnccl-net.so"
deb libnccl-ofi "$OFI_NCCL" "$ARCH" "libfabric1-aws" "aws-ofi-nccl, the NCCL plugin for libfabric" ""

# ---- rdma-core (only ibacm: the distribution's libibverbs stays the distribution's) ----
r=$work/root/ibacm
mkdir -p "$r/usr/share/doc/ibacm"
echo "stand-in ibacm $RDMA_CORE" >"$r/usr/share/doc/ibacm/STAND-IN"
deb ibacm "$RDMA_CORE" "$ARCH" "" "InfiniBand address cache manager (rdma-core)" "rdma-core/"

# ---- kernel modules (skipped with --skip-kmod; never loaded by the stand-in) ----
r=$work/root/efa
mkdir -p "$r/usr/src/efa-${EFA_DRIVER%-*}"
echo "stand-in efa kmod source $EFA_DRIVER" >"$r/usr/src/efa-${EFA_DRIVER%-*}/STAND-IN"
deb efa "$EFA_DRIVER" "$ARCH" "" "EFA kernel module (DKMS source)" "efa-driver/"

r=$work/root/efa-nv-peermem
mkdir -p "$r/usr/src/efa-nv-peermem-1.2.1"
echo "stand-in efa-nv-peermem" >"$r/usr/src/efa-nv-peermem-1.2.1/STAND-IN"
deb efa-nv-peermem 1.2.1-1 "$ARCH" "" "EFA GPUDirect peer memory module (DKMS source)" "efa-driver/"

echo "EFA_INSTALLER_VERSION=$VER" >"$top/env.sh"
install -m 0755 "$(dirname "$0")/efa_installer.sh" "$top/efa_installer.sh"

mkdir -p "$OUT/efa"
tarball=$OUT/efa/aws-efa-installer-$VER.tar.gz
find "$top" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name --mtime="@$SOURCE_DATE_EPOCH" -cf - aws-efa-installer |
  gzip -n -9 >"$tarball"
rm -f "$tarball.sig"
gpg --batch --yes --local-user "$UID_NAME" --output "$tarball.sig" --detach-sign "$tarball"
gpg --batch --yes --armor --export "$UID_NAME" >"$OUT/efa/aws-efa-installer.key"
( cd "$OUT/efa" && sha256sum "aws-efa-installer-$VER.tar.gz" >"aws-efa-installer-$VER.tar.gz.sha256" )
gpg --batch --with-colons --fingerprint "$UID_NAME" | awk -F: '$1 == "fpr" {print $10; exit}' >"$OUT/efa/aws-efa-installer.fingerprint"
echo "efa stand-in: $(cat "$OUT/efa/aws-efa-installer-$VER.tar.gz.sha256") key $(cat "$OUT/efa/aws-efa-installer.fingerprint")"
