"""The training user's Python user site against root (issue 74; SECURITY.md lists the attack).

A task with `become_user: ds` runs its Ansible module (AnsiballZ, the node's python3) as ds
with HOME=/home/ds, so Python imports ~ds/.local/lib/python3.X/site-packages/usercustomize.py.
A hook there can add `ansible_facts` to the module's result; Ansible makes those facts
variables above role defaults and group_vars, and caches them: root then ran the
`ml_stack_venv` the hook named. Now every module runs as root, and only the command a task
starts (ssh, pdsh, the bytecode seed, the config check) drops to ds through runuser.

ds plants such a hook on every node (it notes each import in /tmp/usersite-ran-<uid>, copies
/etc/shadow into ds's home when root imports it, and adds the facts to any JSON result it
sees) and a `/home/ds/pwn/bin/python` that notes who ran it. Then the commands that ran
modules as ds run (provision with the cluster_ssh and pdsh logins forced, doctor, dsconfig):
each still passes, root never imported the hook nor ran the planted python, and no cached
fact names /home/ds/pwn. Everything planted is removed in a finally.
"""

from __future__ import annotations

import pathlib

import pytest
import yaml

from dscluster.paths import cache_root

from .e2e_cluster import dsc
from .test_e2e_attacks import HEAD, N2, N3, as_ds, on

pytestmark = [
    pytest.mark.docker,
    # make test runs it on the second cluster (e2e-second), off the shared cluster's lane
    pytest.mark.second_cluster,
    pytest.mark.usefixtures("provisioned"),
]

PWN = "/home/ds/pwn"

# Imported by every Python process of ds's that does not turn the user site off (-s, -I).
USERCUSTOMIZE = """
import json, os, shutil, sys

_uid = os.getuid()
try:
    with open(f"/tmp/usersite-ran-{_uid}", "a") as _fh:
        _fh.write(f"{_uid} {sys.argv!r}\\n")
except OSError:
    pass
if _uid == 0:  # root imported the training user's code
    try:
        shutil.copyfile("/etc/shadow", "/home/ds/pwned-shadow")
    except OSError:
        pass

_FACTS = {"ml_stack_venv": "/home/ds/pwn", "doctor_venv": "/home/ds/pwn"}


def _poison(obj):
    # an Ansible module's result: what it returns becomes variables on the controller
    if isinstance(obj, dict) and ({"changed", "rc", "invocation"} & set(obj)):
        obj = dict(obj)
        obj["ansible_facts"] = {**(obj.get("ansible_facts") or {}), **_FACTS}
    return obj


_dumps, _encode = json.dumps, json.JSONEncoder.encode
json.dumps = lambda obj, *a, **kw: _dumps(_poison(obj), *a, **kw)
json.JSONEncoder.encode = lambda self, obj: _encode(self, _poison(obj))
"""

SITE = "/home/ds/.local/lib/python3.*/site-packages"
# What the test leaves (and what ds's own python3 compiled of the hook), then the directories
# it made, each only where empty.
CLEAN = (
    f"rm -rf /tmp/usersite-ran-* /tmp/pwn-ran-* /home/ds/pwned-shadow {PWN} "
    f"{SITE}/usercustomize.py {SITE}/__pycache__/usercustomize.*; "
    f"rmdir {SITE}/__pycache__ {SITE} /home/ds/.local/lib/python3.* /home/ds/.local/lib "
    "/home/ds/.local 2>/dev/null; true"
)


def plant(host: str) -> None:
    minor = on(host, "python3 -c 'import sys; print(sys.version_info[1])'", user="ds")
    assert minor.returncode == 0, minor.stderr
    site = f"/home/ds/.local/lib/python3.{minor.stdout.strip()}/site-packages"
    as_ds(host, f"mkdir -p {site} && cat > {site}/usercustomize.py <<'EOF'\n{USERCUSTOMIZE}EOF")
    as_ds(
        host,
        f"mkdir -p {PWN}/bin && printf '#!/bin/sh\\nid >> /tmp/pwn-ran-$(id -u)\\n' "
        f"> {PWN}/bin/python && chmod 755 {PWN}/bin/python",
    )
    # the hook works: ds's own python3 imports it (and would hand its facts to Ansible)
    as_ds(host, "python3 -c 'import json; print(json.dumps({\"rc\": 0}))' | grep -q pwn")


def cached_values_naming_pwn(inventory: pathlib.Path) -> list[str]:
    """Files of the controller's fact cache (and dscluster's per-inventory facts) naming PWN."""
    files = [*(cache_root() / "facts").glob("*"), *(inventory / "facts").glob("*")]
    return [str(f) for f in files if f.is_file() and PWN in f.read_text(errors="replace")]


def test_the_training_users_python_site_never_runs_as_root_nor_reaches_ansible(
    provisioned: pathlib.Path,
):
    hosts = (HEAD, N2, N3)
    path = provisioned / "group_vars" / "all.yml"
    before = path.read_text() if path.exists() else None
    data = (yaml.safe_load(before) if before else None) or {}
    # the logins that ran as ds run again, whatever the controller's record says
    forced = {"cluster_ssh_verify_again": True, "pdsh_verify_again": True}
    try:
        for host in hosts:
            plant(host)
        path.parent.mkdir(exist_ok=True)
        path.write_text("---\n" + yaml.safe_dump(data | forced, sort_keys=True))
        runs = {
            "provision": dsc("provision", "-i", str(provisioned), timeout=3600),
            "doctor": dsc("doctor", "-i", str(provisioned), timeout=900),
            "dsconfig": dsc("dsconfig", "-i", str(provisioned), "--zero", "2", timeout=900),
        }
        for what, proc in runs.items():
            assert proc.returncode == 0, (what, proc.stdout[-3000:] + proc.stderr[-3000:])
            assert PWN not in proc.stdout + proc.stderr, what
        for host in hosts:
            found = on(host, "ls /tmp/usersite-ran-0 /tmp/pwn-ran-0 /home/ds/pwned-shadow")
            assert found.stdout.strip() == "", (host, found.stdout)  # none of them exists
        assert cached_values_naming_pwn(provisioned) == []
    finally:
        for host in hosts:
            on(host, CLEAN)
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)
        for poisoned in cached_values_naming_pwn(provisioned):  # a failed run's, regathered
            pathlib.Path(poisoned).unlink()
