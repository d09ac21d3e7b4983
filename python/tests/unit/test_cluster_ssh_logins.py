"""cluster_ssh's login round (vars/main.yml), rendered by Ansible on the controller: the order
each node logs in to the others (each starts after itself, so no sshd gets every node's first
login at once) and the problems its round's output gives, in the play's order; and the login
script itself, run with a stand-in ssh and runuser: a few logins at a time, each ssh started
through `runuser -u USER --` (root runs the script), one line per host with the exit status
the script saw."""

from __future__ import annotations

import os
import pathlib
import subprocess

import yaml

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_logins.yml"


def rounds(tmp_path: pathlib.Path, hosts: dict[str, dict]) -> dict[str, dict]:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    rc, _, out = rolefiles.run_local_play(PLAYBOOK, {}, "ROUND", inventory=inv)
    assert rc == 0, out
    found = {data["host"]: data for data in rolefiles.tagged(out, "ROUND")}
    assert sorted(found) == sorted(hosts), out
    return found


def test_each_node_starts_after_itself_and_every_step_reaches_each_node_once(tmp_path):
    names = [f"n{i:02d}" for i in range(1, 13)]  # more than sshd's MaxStartups (10)
    found = rounds(tmp_path, {n: {} for n in names})
    for i, n in enumerate(names):
        assert found[n]["order"] == names[i + 1 :] + names[: i + 1]
        assert found[n]["problems"] == []
    for step in range(len(names)):
        assert sorted(found[n]["order"][step] for n in names) == names


def test_problems_are_listed_in_the_play_order_whatever_the_login_order(tmp_path):
    found = rounds(
        tmp_path,
        {
            "a": {},
            "b": {"test_login_lines": ["c\t255\tHost key verification failed.", "a\t0\ta"]},
            "c": {
                "test_login_lines": ["a\t0\tb", "b\t255\tPermission denied (publickey).", "c\t0\tc"]
            },
        },
    )  # fmt: skip
    assert found["a"]["problems"] == []
    assert found["b"]["problems"] == [
        "b (no answer: ssh: no output)",
        "c (rc=255, output: Host key verification failed.)",
    ]
    assert found["c"]["problems"] == [
        "a (rc=0, output: b)",
        "b (rc=255, output: Permission denied (publickey).)",
    ]


# A stand-in for ssh on the node's PATH: notes how many logins are in flight when it starts,
# answers after a second as the host named (second-to-last argument), or as sshd would refuse.
STAND_IN_SSH = """#!/bin/sh
echo "$*" >> "$STATE/args"
for a; do host=$prev; prev=$a; done
touch "$STATE/in.$host"
ls "$STATE" | grep -c '^in[.]' >> "$STATE/in_flight"
sleep 1
rm -f "$STATE/in.$host"
case $host in
  refused) echo "Permission denied (publickey)." >&2; exit 255 ;;
  impostor) echo "some-other-node"; exit 0 ;;
esac
echo "$host"
"""

# A stand-in for runuser: notes the user and the command, and runs it (as this user).
STAND_IN_RUNUSER = """#!/bin/sh
[ "$1" = -u ] && [ "$3" = -- ] || { echo "runuser: bad arguments: $*" >&2; exit 125; }
echo "$2 $4" >> "$STATE/runuser"
shift 3
exec "$@"
"""


def login_round(tmp_path: pathlib.Path, hosts: list[str], timeout: int = 3) -> tuple[dict, list]:
    """Run vars/main.yml's login script as verify.yml does (sh -c SCRIPT sh USER TIMEOUT
    PARALLEL HOST...), ssh and runuser being the stand-ins; returns {host: (rc, output)} and
    the in-flight counts."""
    role_vars = yaml.safe_load(rolefiles.path("cluster_ssh", "vars/main.yml").read_text())
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("ssh", STAND_IN_SSH), ("runuser", STAND_IN_RUNUSER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    argv = ["sh", "-c", role_vars["__cluster_ssh_login_script"], "sh", "ds", str(timeout)]
    argv += [str(role_vars["__cluster_ssh_login_parallel"]), *hosts]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True)
    lines = {}
    for line in done.stdout.splitlines():
        host, rc, output = line.split("\t")
        assert host not in lines, done.stdout
        lines[host] = (rc, output)
    args = (state / "args").read_text().splitlines()
    assert len(args) == len(hosts) and all(f"ConnectTimeout={timeout}" in a for a in args), args
    # every ssh, and nothing else, was started through runuser as the user
    assert (state / "runuser").read_text().splitlines() == ["ds ssh"] * len(hosts)
    return lines, [int(n) for n in (state / "in_flight").read_text().split()]


def test_the_login_round_runs_a_few_logins_at_once_and_reports_each_host_once(tmp_path):
    parallel = yaml.safe_load(rolefiles.path("cluster_ssh", "vars/main.yml").read_text())[
        "__cluster_ssh_login_parallel"
    ]
    # Nodes a group apart put up to twice the group on one sshd; MaxStartups starts dropping
    # unauthenticated connections past 10.
    assert 2 <= parallel <= 5
    hosts = [f"n{i:02d}" for i in range(1, 10)] + ["refused", "impostor"]
    lines, in_flight = login_round(tmp_path, hosts)
    assert sorted(lines) == sorted(hosts)
    assert all(lines[h] == ("0", h) for h in hosts[:9])
    assert lines["refused"] == ("255", "Permission denied (publickey).")
    assert lines["impostor"] == ("0", "some-other-node")
    assert max(in_flight) == parallel, in_flight  # in groups, never more than the group
