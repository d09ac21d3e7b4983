"""`dscluster provision --add`: the argument checks, the plan of ansible-playbook runs, what
is written after them, and the cluster_files tag on every task that writes a cluster-wide file
(the e2e test_e2e_add runs it on a real cluster)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml

from dscluster import inventory, paths, provision
from dscluster.errors import DsclusterError
from dscluster.runner import HostSummary, PlaybookResult


def _inv(inventory_dir: pathlib.Path, **allvars: object) -> inventory.Inventory:
    if allvars:
        hosts = inventory_dir / "hosts.yml"
        extra = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in allvars.items())
        hosts.write_text(hosts.read_text().replace("  vars:\n", "  vars:\n" + extra, 1))
    return inventory.load(inventory_dir)


# ---- the plan --------------------------------------------------------------------------


def test_add_plan_cluster_files_everywhere_then_the_new_node_whole(inventory_dir):
    plan = provision.add_plan(_inv(inventory_dir), ["node-c"])
    assert [(r.playbook, r.limit, r.tags, r.extravars, r.provisions) for r in plan] == [
        ("site.yml", None, "cluster_files", {}, ()),
        ("site.yml", "node-c", None, {}, ("node-c",)),
    ]


def test_add_plan_with_slurm_holds_it_back_then_runs_it_on_every_host(inventory_dir):
    plan = provision.add_plan(_inv(inventory_dir, dscluster_slurm=True), ["node-b", "node-c"])
    assert [(r.playbook, r.limit, r.tags, r.extravars, r.provisions) for r in plan] == [
        ("site.yml", None, "cluster_files", {"dscluster_slurm": False}, ()),
        ("site.yml", "node-b,node-c", None, {"dscluster_slurm": False}, ("node-b", "node-c")),
        ("slurm.yml", None, None, {}, ()),
    ]
    assert plan[1].title() == "site.yml --limit node-b,node-c -e dscluster_slurm=False"


def test_slurm_switch_read_from_the_inventory(inventory_dir):
    assert provision.slurm_enabled(_inv(inventory_dir)) is False
    assert provision.slurm_enabled(_inv(inventory_dir, dscluster_slurm=True)) is True


def test_normal_plan_is_the_one_run_asked_for():
    assert provision.normal_plan("site.yml", None, None) == [
        provision.Run("site.yml", None, None, provisions=None)
    ]
    assert provision.normal_plan("site.yml", "n1", "base")[0].provisions == ()
    assert provision.normal_plan("base.yml", None, None)[0].provisions == ()


# ---- the checks ------------------------------------------------------------------------


def test_check_add_returns_hosts_in_inventory_order_without_repeats(inventory_dir):
    inv = _inv(inventory_dir)
    got = provision.check_add(
        "node-c, node-b,node-c", inv, playbook="site.yml", limit=None, tags=None
    )
    assert got == ["node-b", "node-c"]


@pytest.mark.parametrize(
    ("text", "kw", "needle"),
    [
        ("node-x", {}, "'node-x' is no host of"),
        ("node-b,", {}, "empty host name"),
        ("node-a", {}, "'node-a' is the head"),
        ("node-b", {"limit": "node-b"}, "cannot be combined with --limit"),
        ("node-b", {"tags": "base"}, "cannot be combined with --tags"),
        ("node-b", {"playbook": "base.yml"}, "not --playbook 'base.yml'"),
    ],
)
def test_check_add_refuses(inventory_dir, text, kw, needle):
    args = {"playbook": "site.yml", "limit": None, "tags": None, **kw}
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        provision.check_add(text, _inv(inventory_dir), **args)


def test_cluster_files_is_a_known_tag():
    provision.check_tags("cluster_files")


# ---- the runs and what they leave behind ----------------------------------------------


def _result(failed: dict[str, str] | None = None, hosts=("node-a", "node-b", "node-c")):
    failed = failed or {}
    summaries = {h: HostSummary(ok=3, changed=1) for h in hosts}
    for host in failed:
        summaries[host] = HostSummary(ok=1, unreachable=1)
    return PlaybookResult(
        status="failed" if failed else "successful",
        rc=2 if failed else 0,
        hosts=summaries,
        failures=[(h, task, "Failed to connect") for h, task in failed.items()],
    )


def _record(monkeypatch, outcomes: list[PlaybookResult]) -> list[dict]:
    from dscluster import runner  # noqa: PLC0415

    calls: list[dict] = []

    def fake(playbook, inv, **kw):
        calls.append(
            {"playbook": playbook, **{k: kw.get(k) for k in ("limit", "tags", "extravars")}}
        )
        return outcomes[len(calls) - 1]

    monkeypatch.setattr(runner, "run_playbook", fake)
    return calls


def test_provision_add_runs_the_plan_and_clears_the_added_node(monkeypatch, capsys, inventory_dir):
    from dscluster import cli, degraded  # noqa: PLC0415

    degraded.write_degraded(
        inventory.load(inventory_dir), {"node-c": {"reason": "down", "since": "T0"}}
    )
    calls = _record(monkeypatch, [_result(), _result(hosts=("node-c",))])
    assert cli.main(["provision", "-i", str(inventory_dir), "--add", "node-c"]) == 0
    assert calls == [
        {"playbook": "site.yml", "limit": None, "tags": "cluster_files", "extravars": None},
        {"playbook": "site.yml", "limit": "node-c", "tags": None, "extravars": None},
    ]
    out = capsys.readouterr().out
    assert "site.yml --tags cluster_files on 3 hosts" in out
    assert "degraded record cleared: node-c back in the hostfile" in out
    assert not (inventory_dir / "degraded.json").exists()
    assert (inventory_dir / "hostfile").read_text().count("slots=") == 3


def test_provision_add_stops_after_a_failed_run_and_writes_nothing(
    monkeypatch, capsys, inventory_dir
):
    from dscluster import cli  # noqa: PLC0415

    calls = _record(monkeypatch, [_result({"node-b": "Write the cluster known_hosts"})])
    assert cli.main(["provision", "-i", str(inventory_dir), "--add", "node-c"]) == 1
    assert (
        len(calls) == 1
    )  # the new node is not provisioned against a cluster that does not know it
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("dscluster: error: provisioning (--add node-c) failed on node-b")
    assert not (inventory_dir / "hostfile").exists()


def test_provision_add_degraded_goes_on_without_the_failed_old_node(
    monkeypatch, capsys, inventory_dir
):
    from dscluster import cli  # noqa: PLC0415

    calls = _record(
        monkeypatch, [_result({"node-b": "Gathering Facts"}), _result(hosts=("node-c",))]
    )
    argv = ["provision", "-i", str(inventory_dir), "--add", "node-c", "--allow-degraded"]
    assert cli.main(argv) == 0
    assert [c["limit"] for c in calls] == [None, "node-c"]
    record = json.loads((inventory_dir / "degraded.json").read_text())["excluded"]
    assert list(record) == ["node-b"]
    assert (inventory_dir / "hostfile").read_text() == "node-a slots=4\nnode-c slots=2\n"


def test_provision_add_failing_new_node_is_recorded_degraded(monkeypatch, capsys, inventory_dir):
    from dscluster import cli  # noqa: PLC0415

    _record(
        monkeypatch,
        [_result(), _result({"node-c": "Install the base packages"}, hosts=("node-c",))],
    )
    argv = ["provision", "-i", str(inventory_dir), "--add", "node-c", "--allow-degraded"]
    assert cli.main(argv) == 0
    record = json.loads((inventory_dir / "degraded.json").read_text())["excluded"]
    assert list(record) == ["node-c"] and "Install the base packages" in record["node-c"]["reason"]


def test_provision_without_add_is_one_run_as_before(monkeypatch, capsys, inventory_dir):
    from dscluster import cli  # noqa: PLC0415

    calls = _record(monkeypatch, [_result()])
    assert (
        cli.main(["provision", "-i", str(inventory_dir), "--limit", "node-b", "--tags", "base"])
        == 0
    )
    assert calls == [{"playbook": "site.yml", "limit": "node-b", "tags": "base", "extravars": None}]
    assert "site.yml on 3 hosts" in capsys.readouterr().out


# ---- the tag on every task that writes a cluster-wide file ------------------------------

# A destination naming one of the files whose content depends on the set of hosts.
CLUSTER_FILE = re.compile(r"/etc/hosts\b|known_hosts|slurm\.conf|gres\.conf|exports_file")
WRITERS = {
    "ansible.builtin.template",
    "ansible.builtin.copy",
    "ansible.builtin.blockinfile",
    "ansible.builtin.lineinfile",
    "ansible.builtin.replace",
    "cluster_ssh_files",  # plugins/modules: the paths of its `files`
}
INCLUDES = {"ansible.builtin.include_tasks", "ansible.builtin.import_tasks"}


def _tasks(path: pathlib.Path) -> list[dict]:
    return [t for t in yaml.safe_load(path.read_text()) or [] if isinstance(t, dict)]


def _tags(task: dict) -> set[str]:
    tags = task.get("tags", [])
    return {tags} if isinstance(tags, str) else set(tags)


def _writes_cluster_file(task: dict) -> bool:
    for module in WRITERS & task.keys():
        args = task[module] or {}
        dests = [args.get("dest") or args.get("path") or ""]
        files = args.get("files") or []
        # a list written out, or one template building it (cluster_ssh's one module run)
        dests += (
            [files]
            if isinstance(files, str)
            else [f.get("path", "") for f in files if isinstance(f, dict)]
        )
        if any(CLUSTER_FILE.search(str(dest)) for dest in dests):
            return True
    return False


def test_every_task_writing_a_cluster_file_carries_the_tag():
    root = paths.collection_root()
    found: list[str] = []
    for tasks_file in sorted(root.glob("roles/*/tasks/*.yml")):
        for task in _tasks(tasks_file):
            if _writes_cluster_file(task):
                found.append(f"{tasks_file.parent.parent.name}: {task['name']}")
                assert "cluster_files" in _tags(task), (
                    f"{tasks_file}: {task['name']!r} has no cluster_files tag"
                )
                # a dynamic include reaches its tasks only when the include is tagged too
                main = tasks_file.parent / "main.yml"
                for inc in _tasks(main) if tasks_file != main else []:
                    module = next(iter(INCLUDES & inc.keys()), None)
                    target = (inc.get(module) or {}).get("file") if module else None
                    if target == tasks_file.name and module.endswith("include_tasks"):
                        assert "cluster_files" in _tags(inc), (
                            f"{main}: include of {target} untagged"
                        )
    # the test sees the files it is about (a rename would make it pass on nothing)
    assert {f.split(":")[0] for f in found} == {"base", "cluster_ssh", "nfs_server", "slurm"}
    assert len(found) >= 6, found


def test_the_tasks_those_files_read_from_every_host_carry_the_tag():
    root = paths.collection_root()
    needed = {
        "base/preflight.yml": ["Gather network facts of inventory hosts outside this play"],
        "cluster_ssh/preflight.yml": [
            "Read the SSH user and this node's host key",
            "Keep the reading",
            "Read the public host keys of inventory hosts outside this play",
        ],
        "nfs_server/preflight.yml": ["Gather network facts of the clients"],
    }
    for rel, names in needed.items():
        tasks = {t["name"]: t for t in _tasks(root / "roles" / rel.replace("/", "/tasks/"))}
        for name in names:
            assert "cluster_files" in _tags(tasks[name]), f"{rel}: {name!r}"
    # slurm.conf is reached under --tags cluster_files only if the hosts are grouped
    plays = yaml.safe_load((root / "playbooks" / "slurm.yml").read_text())
    assert "cluster_files" in _tags(plays[0]["tasks"][0])
