#!/bin/sh
# Run inside a copy of a provisioned node (never the node itself) by `dscluster image bake`:
# take out everything that makes the copy one particular node of one particular cluster, and
# everything the cluster or its users made there, so every node started from the baked image
# makes its own identity at first boot and `dscluster provision` gives it its cluster's. What
# stays is what provisioning installed: packages, the training user (its home as /etc/skel
# makes it), the venv, the wheels, and the ranks' bytecode, made again here from the venv.
# On EC2 an AMI is made from the running node, so the same script runs once on each node
# started from it instead, from cloud-init's bootcmd (before its ssh module makes new host
# keys and installs the key pair), with the second argument `first-boot`.
# Arguments: the training user; the mode (image or first-boot); the ranks' bytecode prefix
# (ml_stack_pycache_dir); the venv; the node-local directories whose contents go (torch
# extensions, scratch, node-local checkpoints and job area), ':'-separated; then the modules a
# job imports, compiled into the prefix. Each "" (or left out) takes its default.
# The training user is not trusted (every job runs as it): nothing here follows a link it
# could have made, and nothing it owns is run as root. This copy runs no process of it, so
# what is checked stays as checked.
set -eu
user="${1:-ds}"
mode="${2:-image}"
prefix="${3:-/opt/dscluster/pycache}"
venv="${4:-/opt/dscluster/venv}"
dirs="${5:-/opt/dscluster/torch_extensions:/var/lib/dscluster/scratch:/var/lib/dscluster/checkpoints}"
if [ $# -gt 5 ]; then shift 5; else set --; fi  # "$@": the modules
seed=/opt/dscluster/bin/pycache_seed.py  # ml_stack's, root's (install.yml)

# SSH host keys: ssh-hostkeys.service (cloud-init's ssh module on EC2) makes new ones.
rm -f /etc/ssh/ssh_host_*
# The machine id: systemd makes one at first boot when the file is empty (on a booted
# EC2 node systemd already read it: left as it is).
if [ "$mode" = image ]; then
  : > /etc/machine-id
  rm -f /var/lib/dbus/machine-id
fi

# The training user's account: uid, gid, home ("" where it has none).
account=$(getent passwd "$user" || true)
uid=$(printf '%s' "$account" | cut -d: -f3)
gid=$(printf '%s' "$account" | cut -d: -f4)
home=$(printf '%s' "$account" | cut -d: -f6)

# Image: every file the training user owns on this disk goes (its crontab, mail, a file in a
# directory anyone can write, the prefix's bytecode, its home's files: made again below).
# Its directories stay: provisioning made some of them (emptied below). A link goes as a link.
if [ "$mode" = image ] && [ -n "$uid" ] && [ "$uid" != 0 ]; then
  find / -xdev -user "$uid" ! -type d -exec rm -f -- {} + 2>/dev/null || true
fi

# Keys that log in: root's and every user's authorized_keys, and authorized_keys2, which an
# sshd left at its default also reads (cluster_ssh now names only the first); root's key pairs
# and known hosts. A ~/.ssh that is a link is removed as a link, never followed.
for dir in /root /home/*; do
  [ -d "$dir" ] && [ ! -L "$dir" ] || continue
  if [ -L "$dir/.ssh" ]; then
    rm -f "$dir/.ssh"
  elif [ -d "$dir/.ssh" ]; then
    rm -f "$dir/.ssh/authorized_keys" "$dir/.ssh/authorized_keys2"
  fi
done
if [ -d /root/.ssh ] && [ ! -L /root/.ssh ]; then
  rm -f /root/.ssh/id_* /root/.ssh/known_hosts /root/.ssh/known_hosts.old
fi
rm -f /etc/ssh/ssh_known_hosts

# The job secrets provision writes (deepspeed_launcher_secret_env_file); provision writes
# them again on each node started from the image.
rm -f /var/lib/dscluster/secrets.env
# Root's job records (the job supervisor's): every job's log, state and outputs, which may
# hold what a job printed (a token, a path) and are another cluster's history.
rm -rf /var/lib/dscluster/jobs

# The training user's home, back to /etc/skel: its cluster key, tokens (~/.netrc,
# ~/.cache/huggingface), shell history, ~/.local (a usercustomize.py or .pth there runs in
# its pythons), checkpoints. Emptied, never followed: rm -rf removes a link, not its target.
# A home that is itself a link (only root could have made one) is removed as a link and
# made again as a directory of the user, 0700: its target is not this account's to empty.
# A home of root or at the top of the tree (/, /home) is no training user's: left alone.
reset_home() {
  case "$home" in
    /*/*) ;;
    *) echo "clean.sh: $user's home is ${home:-none}: left as it is"; return 0 ;;
  esac
  if [ "$uid" = 0 ]; then
    echo "clean.sh: $user is root: its home is left as it is"
    return 0
  fi
  if [ -L "$home" ] || { [ -e "$home" ] && [ ! -d "$home" ]; }; then
    rm -f "$home"
  fi
  if [ ! -d "$home" ]; then
    mkdir -m 0700 "$home"
  fi
  find "$home" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
  # each of skel's entries (cp -a of skel/. would give the home skel's own mode too)
  if [ -d /etc/skel ]; then
    find /etc/skel -mindepth 1 -maxdepth 1 -exec cp -a -- {} "$home/" \;
  fi
  chown -R --no-dereference "$uid:$gid" "$home"
}
[ -z "$uid" ] || reset_home

# Empty a directory provisioning made (it makes each again as it wants it, and expects it
# there): only where it is a directory, not a link, on a disk of this machine (a shared file
# system mounted at boot is the cluster's, never this copy's to empty).
empty_dir() {
  case "$1" in
    /*/*) ;;
    *) [ -z "$1" ] || echo "clean.sh: $1 is no directory of the training user's: left as it is"
       return 0 ;;
  esac
  [ -d "$1" ] || return 0
  if [ -L "$1" ]; then
    echo "clean.sh: $1 is a link: not followed, left as it is"
    return 0
  fi
  case "$(stat -f -c %T "$1")" in
    ext2/ext3 | xfs | btrfs | overlayfs | tmpfs | zfs | f2fs) ;;
    *)
      echo "clean.sh: $1 is on $(stat -f -c %T "$1"), not this machine's disk: left as it is"
      return 0
      ;;
  esac
  find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
}
# Node-local directories the training user writes: what its jobs made there goes.
old_ifs=$IFS
set -f
IFS=:
for dir in $dirs; do
  IFS=$old_ifs
  empty_dir "$dir"
done
IFS=$old_ifs
set +f

if [ "$mode" = image ]; then
  # The ranks' bytecode prefix is the training user's, so whatever a job put there would run
  # in every job of every node of the image: it is emptied and seeded again from the venv
  # (root's), with the modules a job imports, as the training user by an isolated python
  # (-I: nothing of the home, the environment or the working directory). Its home is emptied
  # again after, of what those imports cached there. Without the seed script or the venv the
  # prefix stays empty: the first job on each node compiles it.
  if [ -d "$prefix" ] && [ ! -L "$prefix" ]; then
    empty_dir "$prefix"
    if [ -z "$uid" ] || [ "$uid" = 0 ]; then
      echo '{"seed_failed": true}'
    elif [ -f "$seed" ] && [ -x "$venv/bin/python" ]; then
      (cd / && runuser -u "$user" -- python3 -I "$seed" "$venv" "$prefix" "$@") ||
        echo '{"seed_failed": true}'
      reset_home
    else
      echo "clean.sh: no $seed or no $venv/bin/python: the ranks' bytecode is left empty"
      echo '{"seed_failed": true}'
    fi
  fi
fi

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
rm -rf /tmp/.[!.]* /var/tmp/.[!.]* 2>/dev/null || true
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' \) -delete 2>/dev/null || true
find /var/log -type f -exec truncate -s 0 {} + 2>/dev/null || true
echo "cleaned"
