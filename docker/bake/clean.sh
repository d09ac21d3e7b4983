#!/bin/sh
# Run inside a copy of a provisioned node (never the node itself) by `dscluster image bake`:
# take out everything that makes the copy one particular node of one particular cluster,
# so every node started from the baked image makes its own at first boot and `dscluster
# provision` gives it its cluster's. What stays is the installed stack: packages, the
# training user, the venv, the wheels, the torch extensions, and the ranks' bytecode
# (ml_stack_pycache_dir, /opt/dscluster/pycache: jobs on the baked nodes start from it).
# On EC2 an AMI is made from the running node, so the same script runs once on each node
# started from it instead, from cloud-init's bootcmd (before its ssh module makes new host
# keys and installs the key pair), with the second argument `first-boot`.
# Arguments: the training user (its ~/.ssh holds the cluster key); the mode (image or
# first-boot).
set -eu
user="${1:-ds}"
mode="${2:-image}"

# SSH host keys: ssh-hostkeys.service (cloud-init's ssh module on EC2) makes new ones.
rm -f /etc/ssh/ssh_host_*
# The machine id: systemd makes one at first boot when the file is empty (on a booted
# EC2 node systemd already read it: left as it is).
if [ "$mode" = image ]; then
  : > /etc/machine-id
  rm -f /var/lib/dbus/machine-id
fi
# Cluster SSH: the cluster key pair, the keys allowed in and the hosts known, for root and
# the training user; the cluster-wide known_hosts.
for home in /root "$(getent passwd "$user" | cut -d: -f6)"; do
  [ -n "$home" ] && [ -d "$home/.ssh" ] || continue
  rm -f "$home/.ssh/id_ed25519" "$home/.ssh/id_ed25519.pub" \
        "$home/.ssh/authorized_keys" "$home/.ssh/known_hosts"
done
rm -f /etc/ssh/ssh_known_hosts
# Slurm: the munge key and the cluster's configuration (provision writes both); munge
# waits for its key instead of failing at boot (slurmd/slurmctld already wait for slurm.conf).
rm -f /etc/munge/munge.key /etc/slurm/slurm.conf /etc/slurm/gres.conf
if [ -d /etc/munge ]; then
  mkdir -p /etc/systemd/system/munge.service.d
  printf '[Unit]\nConditionPathExists=/etc/munge/munge.key\n' \
    > /etc/systemd/system/munge.service.d/dscluster-baked.conf
fi
# Caches, logs and temporary files of the node it was.
rm -rf /root/.cache /root/.ansible /var/cache/apt/archives/*.deb \
       /var/cache/apt/archives/partial/* /var/log/journal/* /tmp/* /var/tmp/* 2>/dev/null || true
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' \) -delete 2>/dev/null || true
find /var/log -type f -exec truncate -s 0 {} + 2>/dev/null || true
echo "cleaned"
