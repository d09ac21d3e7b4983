#!/bin/bash
# dscluster stand-in for AWS's efa_installer.sh (shipped in the stand-in tarball).
# Same options, same package layout (DEBS/<OS>/<arch>/, rdma-core/, efa-driver/), same record
# of what it installed (/opt/amazon/efa_installed_packages). It installs only the stand-in
# .debs next to it (apt-get from its own directory), never loads a kernel module and never
# pretends a device exists.
set -uo pipefail

cd "$(dirname "$0")" || exit 1
# shellcheck disable=SC1091
source ./env.sh
if [ -z "${EFA_INSTALLER_VERSION:-}" ]; then
	echo "Installer version is not defined in env.sh" >&2
	exit 1
fi

INSTALLED_PKGS_FILE=/opt/amazon/efa_installed_packages
LIMITS_FILE=/etc/security/limits.d/01_efa.conf
DBG_PKGS=0 UNINSTALL=0 UNATTENDED=0 NO_VERIFY=0 SKIP_LIMITS=0 SKIP_KMOD=0 MINIMAL=0
SKIP_PLUGIN=0 SKIP_MPI=0

usage() {
	cat <<USAGE
usage: $(basename "$0") [options]

Options:
 -d, --debug-packages	Install debug packages
 -u, --uninstall	Uninstall EFA packages
 -y, --yes		Run installer without prompting for confirmation
 -n, --no-verify	Skip EFA device verification and test
 -l, --skip-limit-conf	Skip EFA limit configuration
 -k, --skip-kmod	Skip EFA kmod installation
 -g, --enable-gdr	Enable GPUDirect RDMA support (enabled by default)
 -m, --minimal		Only install kernel module and rdma-core, do not install openmpi and libfabric
     --skip-plugin	Do not install the aws-ofi-nccl plugin
     --skip-mpi		Do not install Open MPI
USAGE
}

if ! opts=$(getopt -o duynlkgmh -l debug-packages,uninstall,yes,no-verify,skip-limit-conf,skip-kmod,enable-gdr,minimal,skip-plugin,skip-mpi,help -n "$(basename "$0")" -- "$@"); then
	usage >&2
	exit 1
fi
eval set -- "$opts"
while true; do
	case "$1" in
	-d | --debug-packages) DBG_PKGS=1 ;;
	-u | --uninstall) UNINSTALL=1 ;;
	-y | --yes) UNATTENDED=1 ;;
	-n | --no-verify) NO_VERIFY=1 ;;
	-l | --skip-limit-conf) SKIP_LIMITS=1 ;;
	-k | --skip-kmod) SKIP_KMOD=1 ;;
	-g | --enable-gdr) ;;
	-m | --minimal) MINIMAL=1 ;;
	--skip-plugin) SKIP_PLUGIN=1 ;;
	--skip-mpi) SKIP_MPI=1 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	esac
	shift
done

if [ "$(id -u)" -ne 0 ]; then
	echo "Error: This script must be run as root." >&2
	exit 1
fi

# shellcheck disable=SC1091
. /etc/os-release
case "${ID:-}-${VERSION_ID:-}" in
debian-12) OS_DIR=DEBIAN12 ;;
*)
	echo "Unsupported operating system: ${PRETTY_NAME:-unknown} (this stand-in carries DEBIAN12 packages only)." >&2
	exit 1
	;;
esac
case "$(uname -m)" in
x86_64 | aarch64) ARCH_DIR=$(uname -m) ;;
*) echo "Error: unknown architecture, exiting." >&2; exit 1 ;;
esac
BASE_DIR=DEBS/${OS_DIR}/${ARCH_DIR}
export DEBIAN_FRONTEND=noninteractive

prompt() {
	local reply
	read -r -p "$1 [y/N] " reply || return 1
	case "$reply" in [yY] | [yY][eE][sS]) return 0 ;; esac
	return 1
}

uninstall() {
	if [ ! -f "$INSTALLED_PKGS_FILE" ]; then
		echo "EFA packages are not installed."
		return 0
	fi
	local names=()
	for pkg in $(grep -v '^#' "$INSTALLED_PKGS_FILE"); do
		names+=("${pkg%%_*}")
	done
	if [ "${#names[@]}" -gt 0 ] && ! apt-get purge -y "${names[@]}"; then
		echo "Error: Failed to remove packages" >&2
		return 1
	fi
	rm -f "$INSTALLED_PKGS_FILE" "$LIMITS_FILE"
	echo "EFA packages uninstalled."
}

if [ "$UNINSTALL" -eq 1 ]; then
	if [ "$UNATTENDED" -ne 1 ]; then
		prompt "Uninstall EFA packages?" || exit 1
	fi
	uninstall
	exit $?
fi

if [ "$UNATTENDED" -ne 1 ]; then
	prompt "This script will install the EFA software (version ${EFA_INSTALLER_VERSION}). Do you want to continue?" || exit 1
fi

paths=()
if [ "$MINIMAL" -eq 0 ]; then
	for deb in "$BASE_DIR"/*.deb; do
		case "$(basename "$deb")" in
		libnccl-ofi_*) [ "$SKIP_PLUGIN" -eq 1 ] && continue ;;
		esac
		paths+=("$deb")
	done
fi
paths+=("$BASE_DIR"/rdma-core/*.deb)
if [ "$SKIP_KMOD" -eq 0 ]; then
	if [ -e /.dockerenv ] || grep -qa 'container=' /proc/1/environ 2>/dev/null; then
		echo "Error: kernel modules cannot be installed in a container; re-run with --skip-kmod." >&2
		exit 1
	fi
	paths+=("$BASE_DIR"/efa-driver/*.deb)
fi
for p in "${paths[@]}"; do
	if ! grep -Fxq "$p" package_list.txt; then
		echo "Error: unknown package found: $p" >&2
		echo "Please remove unknown packages from the RPMS/DEBS directory trees" >&2
		exit 1
	fi
done

echo "== Installing EFA packages =="
if ! apt-get install -y --allow-downgrades "${paths[@]/#/./}"; then
	echo "Error: Failed to install packages." >&2
	exit 1
fi

if [ "$SKIP_LIMITS" -eq 0 ]; then
	mkdir -p "$(dirname "$LIMITS_FILE")"
	printf '%s\n' '# EFA settings' '* soft memlock unlimited' '* hard memlock unlimited' >"$LIMITS_FILE"
fi

installed=()
for p in "${paths[@]}"; do
	installed+=("$(basename "${p%.deb}")")
done
mkdir -p /opt/amazon
debug=no
[ "$DBG_PKGS" -eq 1 ] && debug=yes
cat >"$INSTALLED_PKGS_FILE" <<RECORD
# EFA installer version: ${EFA_INSTALLER_VERSION}
# Debug packages installed: ${debug}
# Packages installed:
${installed[*]}
RECORD
ldconfig 2>/dev/null || true

if [ "$NO_VERIFY" -eq 0 ]; then
	if ls /sys/class/infiniband 2>/dev/null | grep -q efa; then
		echo "EFA device found; the stand-in cannot test it (run the real installer on EFA hardware)."
	else
		echo "EFA device not detected, skipping test."
	fi
fi
[ "$SKIP_MPI" -eq 1 ] || echo "Note: this stand-in ships no Open MPI."

echo "==================================================="
echo "EFA installation complete."
echo "- Please logout/login to complete the installation."
echo "- Libfabric was installed in /opt/amazon/efa"
echo "==================================================="
