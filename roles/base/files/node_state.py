"""What the base role's checks read on a node, in one round trip instead of one task each.

Run as `python3 -c <this file> '<json request>'` by roles/base/tasks (preflight.yml before
anything changes, verify.yml after); prints one JSON object with only the parts asked for:

  dpkg          {rc, stdout} of the role's dpkg-query argv (the base packages' states)
  shm_df        {rc, stdout} of `df -Pk /dev/shm`
  owners        {uid: [account names], gid: [group names]} that hold the training ids
  account       the training user's passwd entry as getent lists it (password, uid, gid,
                gecos, home, shell), or null
  group         the gid of the named group, or null when there is no such group
  stats         {path: file_stat} for each path asked: a file's {sha1, uid, gid, mode}, a
                directory's {isdir, uid, gid, mode}, null when it is not there (configure.yml
                skips a write whose file already reads as the write would leave it)
  session_limits  /proc/<sshd>/limits: the hard limits login sessions inherit (containers)
  limits_file   the text of the limits file, or null when it is missing
  etc_hosts     the text of /etc/hosts
  own_name      {rc, stdout} of `getent hosts <hostname>`
  chrony        `systemctl is-active chrony` (its first line)
  shared_dir    {exists, isdir} of the shared directory
  ansiballz     the bytecode hook an older dscluster installed, for the request
                {cache_dir, names}: site_dir (where this python3 reads .pth
                files), stats {name: file_stat} of the names in it, cache (the cache
                directory's file_stat) and entries (how many it holds; null without it)
"""

import contextlib
import grp
import hashlib
import json
import os
import pwd
import site
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
    """sha1 (the checksum Ansible's copy and template compare), owner, group and mode; a
    directory's isdir, owner, group and mode."""
    try:
        st = os.stat(path)
        about = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
        if stat.S_ISDIR(st.st_mode):
            return about | {"isdir": True}
        with open(path, "rb") as fh:
            return about | {"sha1": hashlib.sha1(fh.read()).hexdigest()}
    except OSError:
        return None


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


def group_gid(name):
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def session_limits(_):
    limits = run(SESSION_LIMITS, shell=True)
    if limits["rc"] != 0:
        sys.exit("cannot read the limits of sshd: " + limits["stderr"].strip())
    return limits["stdout"]


def ansiballz(want):
    """Where the bytecode hook of Ansible's module payloads goes and what is there already."""
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    site_dir = dirs[0] if dirs else None
    cache = file_stat(want["cache_dir"])
    return {
        "site_dir": site_dir,
        "stats": {n: site_dir and file_stat(os.path.join(site_dir, n)) for n in want["names"]},
        "cache": cache,
        "entries": len(os.listdir(want["cache_dir"])) if cache and cache.get("isdir") else None,
    }


def chrony(_):
    state = run(["systemctl", "is-active", "chrony"])["stdout"].strip().splitlines()
    return state[0] if state else ""


# part -> how to read it from the request's value
READERS = {
    "dpkg": run,
    "shm_df": lambda _: run(["df", "-Pk", "/dev/shm"]),
    "owners": lambda ids: owners(int(ids["uid"]), int(ids["gid"])),
    "account": account,
    "group": group_gid,
    "stats": lambda paths: {path: file_stat(path) for path in paths},
    "limits_file": read,
    "own_name": lambda name: run(["getent", "hosts", name]),
    "ansiballz": ansiballz,
    "shared_dir": lambda path: {"exists": os.path.lexists(path), "isdir": os.path.isdir(path)},
}
# parts read only when the request's value is true
SWITCHED = {
    "session_limits": session_limits,
    "etc_hosts": lambda _: read("/etc/hosts") or "",
    "chrony": chrony,
}


def main():
    want = json.loads(sys.argv[1])
    out = {part: reader(want[part]) for part, reader in READERS.items() if part in want}
    out |= {part: reader(True) for part, reader in SWITCHED.items() if want.get(part)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
