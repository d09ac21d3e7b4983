"""Print, as JSON, how each directory asked for stands on this node (tasks/configure.yml).

  python3 -c "$(cat dir_state.py)" '["/path", ...]'

{path: null} where nothing is there, else {path: {"isdir", "owner", "mode"}} with the owner's
account name (its uid where no account has it) and the permission bits as the file module's
mode is written ('0755'). configure.yml skips each write whose directory already reads as
the write would leave it.
"""

import json
import os
import pwd
import stat
import sys


def dir_state(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    return {"isdir": stat.S_ISDIR(st.st_mode), "owner": owner, "mode": mode}


print(json.dumps({path: dir_state(path) for path in json.loads(sys.argv[1])}, sort_keys=True))
