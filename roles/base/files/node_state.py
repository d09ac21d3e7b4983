"""What the base role's checks read on a node, in one round trip instead of one task each.

Run as `python3 -c <this file> '<json request>'` by roles/base/tasks (preflight.yml before
anything changes, verify.yml after); prints one JSON object with only the parts asked for:

  dpkg          {rc, stdout} of the role's dpkg-query argv (the base packages' states)
  shm_df        {rc, stdout} of `df -Pk /dev/shm`
  owners        {uid: [account names], gid: [group names]} that hold the training ids
  account       the training user's passwd entry as getent lists it (password, uid, gid,
                gecos, home, shell), or null
  session_limits  /proc/<sshd>/limits: the hard limits login sessions inherit (containers)
  limits_file   the text of the limits file, or null when it is missing
  limits_stat   {sha1, uid, gid, mode} of the limits file, or null: configure.yml skips its
                write when the file already reads as the write would leave it
  etc_hosts     the text of /etc/hosts
  own_name      {rc, stdout} of `getent hosts <hostname>`
  chrony        `systemctl is-active chrony` (its first line)
  shared_dir    {exists, isdir} of the shared directory
"""

import contextlib
import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys

SESSION_LIMITS = """
pid="$(systemctl show --property=MainPID --value ssh.service 2>/dev/null)"
if [ -z "$pid" ] || [ "$pid" = 0 ]; then pid=1; fi
cat "/proc/$pid/limits"
"""


def run(argv, shell=False):
    try:
        proc = subprocess.run(argv, shell=shell, capture_output=True, text=True, check=False)
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def file_stat(path):
    """sha1 (the checksum Ansible's copy and template compare), owner, group and mode."""
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            digest = hashlib.sha1(fh.read()).hexdigest()
    except OSError:
        return None
    return {
        "sha1": digest,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
    }


def limits_files(want):
    """The limits file's text (limits_file) and its file_stat (limits_stat), as asked."""
    out = {}
    if "limits_file" in want:
        out["limits_file"] = read(want["limits_file"])
    if "limits_stat" in want:
        out["limits_stat"] = file_stat(want["limits_stat"])
    return out


def owners(uid, gid):
    users, groups = [], []
    with contextlib.suppress(KeyError):
        users.append(pwd.getpwuid(uid).pw_name)
    with contextlib.suppress(KeyError):
        groups.append(grp.getgrgid(gid).gr_name)
    return {"uid": users, "gid": groups}


def account(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    fields = (entry.pw_passwd, entry.pw_uid, entry.pw_gid, entry.pw_gecos, entry.pw_dir)
    return [str(f) for f in fields] + [entry.pw_shell]


def main():
    want = json.loads(sys.argv[1])
    out = {}
    if "dpkg" in want:
        out["dpkg"] = run(want["dpkg"])
    if "shm_df" in want:
        out["shm_df"] = run(["df", "-Pk", "/dev/shm"])
    if "owners" in want:
        out["owners"] = owners(int(want["owners"]["uid"]), int(want["owners"]["gid"]))
    if "account" in want:
        out["account"] = account(want["account"])
    if want.get("session_limits"):
        limits = run(SESSION_LIMITS, shell=True)
        if limits["rc"] != 0:
            sys.exit("cannot read the limits of sshd: " + limits["stderr"].strip())
        out["session_limits"] = limits["stdout"]
    out.update(limits_files(want))
    if want.get("etc_hosts"):
        out["etc_hosts"] = read("/etc/hosts") or ""
    if "own_name" in want:
        out["own_name"] = run(["getent", "hosts", want["own_name"]])
    if want.get("chrony"):
        state = run(["systemctl", "is-active", "chrony"])["stdout"].strip().splitlines()
        out["chrony"] = state[0] if state else ""
    if "shared_dir" in want:
        path = want["shared_dir"]
        out["shared_dir"] = {"exists": os.path.lexists(path), "isdir": os.path.isdir(path)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
