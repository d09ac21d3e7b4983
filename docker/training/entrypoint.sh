#!/bin/sh
# dscluster training container entrypoint.
# - makes this container's own SSH host keys (none are baked into the image);
# - installs authorized keys from /etc/dscluster/authorized_keys (mount it, read-only) and
#   known hosts from /etc/dscluster/known_hosts (the cluster's pinned host keys);
# - "sshd" (the default command) runs sshd in the foreground; anything else is exec'd.
set -eu
ssh-keygen -A >/dev/null
if [ -f /etc/dscluster/authorized_keys ]; then
    install -m 0600 /etc/dscluster/authorized_keys /root/.ssh/authorized_keys
fi
if [ -f /etc/dscluster/known_hosts ]; then
    install -m 0644 /etc/dscluster/known_hosts /etc/ssh/ssh_known_hosts
fi
# pdsh and ssh use the same port as this image's sshd, host key checking stays strict.
cat > /etc/ssh/ssh_config.d/10-dscluster.conf <<CONF
Host *
    Port ${DSCLUSTER_SSH_PORT}
    StrictHostKeyChecking yes
    BatchMode yes
CONF
if [ "${1:-sshd}" = "sshd" ]; then
    exec /usr/sbin/sshd -D -e
fi
exec "$@"
