"""What the pdsh role decides on, read on a node in one round trip.

Run as `python3 -c <this file> '<json request>'` by roles/pdsh/tasks/install.yml with
{"packages": [...], "rcmd_file": path}; prints one JSON object:

  installed   the packages dpkg lists as installed ("ii")
  rcmd_dir    {uid, gid, mode, isdir} of the rcmd file's directory, or null
  rcmd_file   {sha1, uid, gid, mode} of the rcmd file, or null

configure.yml skips a write whose file already reads as that write would leave it.
"""

import hashlib
import json
import os
import stat
import subprocess
import sys


def describe(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    about = {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
    if stat.S_ISDIR(st.st_mode):
        return about | {"isdir": True}
    try:
        with open(path, "rb") as fh:
            # sha1: the checksum Ansible's copy compares
            about["sha1"] = hashlib.sha1(fh.read()).hexdigest()
    except OSError:
        return None
    return about


def installed(packages):
    try:
        proc = subprocess.run(
            ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\n", *packages],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return []
    return [f[0] for f in (line.split() for line in proc.stdout.splitlines()) if f[1:2] == ["ii"]]


def main(request):
    rcmd = request["rcmd_file"]
    return {
        "installed": installed(request["packages"]),
        "rcmd_dir": describe(os.path.dirname(rcmd)),
        "rcmd_file": describe(rcmd),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
