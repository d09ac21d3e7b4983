"""What the cluster_ssh role decides on, read on a node in one round trip.

Run as `python3 -c <this file> '<json request>'` by roles/cluster_ssh/tasks/preflight.yml
with {"user", "host_key", "known_hosts"}; prints one JSON object:

  account        the SSH user's {uid, gid, home}, or null when there is no such user
  host_key       this node's public host key file, base64 (as slurp returns it)
  ssh_dir        {uid, gid, mode, isdir} of ~user/.ssh, or null
  files          {name: {sha1, uid, gid, mode} or null} for id_ed25519, id_ed25519.pub and
                 authorized_keys under ~user/.ssh
  authorized     every key line of authorized_keys: {key: "type base64", line: the line}
  known_hosts    {sha1, uid, gid, mode} of the known_hosts file, or null

The role skips a write whose file already reads as that write would leave it; anything else
(a file missing, another content, owner or mode) leaves the write to run.
"""

import base64
import hashlib
import json
import os
import pwd
import stat
import sys

KEY_TYPES = ("ssh-", "ecdsa-", "sk-")


def no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def describe(path):
    # lstat, and no read through a link or of anything but a regular file: the training user
    # owns ~/.ssh, and whatever else is there reads as differing, so the module sees it.
    try:
        st = os.lstat(path)
    except OSError:
        return None
    about = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
    if stat.S_ISDIR(st.st_mode):
        return about | {"isdir": True}
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        return about | {"unsafe": True}
    try:
        with open(path, "rb", opener=no_follow) as fh:
            # sha1: the checksum Ansible's copy and template compare
            about["sha1"] = hashlib.sha1(fh.read()).hexdigest()
    except OSError:
        return None
    return about


def authorized(path):
    keys = []
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return keys
        with open(path, encoding="utf-8", errors="replace", opener=no_follow) as fh:
            for line in fh:
                key = key_of(line)
                if key:
                    keys.append({"key": key, "line": line.strip()})
    except OSError:
        pass
    return keys


def key_of(line):
    """The "type base64" of a key line, after its options (from="a,b",no-pty ...) as sshd
    skips them (to the first blank outside quotes); None for a comment or anything else."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if not text.startswith(KEY_TYPES):
        quoted, i = False, 0
        while i < len(text):
            if text[i] == "\\" and quoted:
                i += 2
                continue
            if text[i] == '"':
                quoted = not quoted
            elif text[i] in " \t" and not quoted:
                break
            i += 1
        text = text[i:]
    fields = text.split()
    if len(fields) >= 2 and fields[0].startswith(KEY_TYPES):
        return f"{fields[0]} {fields[1]}"
    return None


def main(request):
    try:
        with open(request["host_key"], "rb") as fh:
            host_key = base64.b64encode(fh.read()).decode()
    except OSError as exc:
        sys.exit(f"cannot read this node's public host key {request['host_key']}: {exc}")
    state = {
        "account": None,
        "host_key": host_key,
        "ssh_dir": None,
        "files": {},
        "authorized": [],
        "known_hosts": describe(request["known_hosts"]),
    }
    try:
        entry = pwd.getpwnam(request["user"])
    except KeyError:
        return state
    state["account"] = {"uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir}
    ssh_dir = os.path.join(entry.pw_dir, ".ssh")
    state["ssh_dir"] = describe(ssh_dir)
    for name in ("id_ed25519", "id_ed25519.pub", "authorized_keys"):
        state["files"][name] = describe(os.path.join(ssh_dir, name))
    state["authorized"] = authorized(os.path.join(ssh_dir, "authorized_keys"))
    return state


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
