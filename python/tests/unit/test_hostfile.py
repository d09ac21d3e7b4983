from __future__ import annotations

import json
import pathlib
import re

import pytest

from dscluster import hostfile, inventory
from dscluster.deepspeed_env import parse_env_file, render_env
from dscluster.degraded import check_degraded, update_degraded, write_degraded
from dscluster.errors import DsclusterError
from dscluster.launch_env import derive_env, derive_launch_env, omp_threads
from dscluster.launch_files import write_launch_files
from dscluster.node_facts import NodeFacts, read_facts_file

from .accel_fixtures import (
    accelerators,
    fixture,
    make_root,
    nccl_profile,
    outputs,
    rename_interface,
)
from .facts import write_facts

# DeepSpeed's own hostfile pattern (deepspeed/launcher/runner.py::_parse_hostfile); the e2e
# test also runs DeepSpeed's fetch_hostfile on the cluster against the written file.
DS_HOSTFILE_RE = re.compile(r"^(\S+)\s+slots=(\d+)")


def test_render_hostfile_head_first_and_parseable():
    text = hostfile.render_hostfile([("head-1", 4), ("w-1", 2)])
    assert text == "head-1 slots=4\nw-1 slots=2\n"
    parsed = [DS_HOSTFILE_RE.match(line).groups() for line in text.splitlines()]
    assert parsed == [("head-1", "4"), ("w-1", "2")]


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ([], "no hosts"),
        ([("a", 1), ("a", 2)], "appears twice"),
        ([("a", 0)], "slots=0"),
        ([("a", -1)], "slots=-1"),
        ([("a b", 1)], "cannot go in a DeepSpeed hostfile"),
        ([("n[1-2]", 1)], "cannot go in a DeepSpeed hostfile"),
        ([("a,b", 1)], "cannot go in a DeepSpeed hostfile"),
    ],
)
def test_render_hostfile_rejects(entries, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        hostfile.render_hostfile(entries)


def test_render_env_plain_lines():
    text = render_env({"PATH": "/opt/v/bin:/usr/bin", "NCCL_SOCKET_IFNAME": "eth0"})
    assert text == "PATH=/opt/v/bin:/usr/bin\nNCCL_SOCKET_IFNAME=eth0\n"
    for line in text.splitlines():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[^\s\"'`$\\]+", line)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("PATH", "$HOME/bin", "'$'"),
        ("X", "a`b`", "'`'"),
        ("X", 'say "hi"', "'\"'"),
        ("X", "a\\b", "'\\\\'"),
        ("X", "", "empty"),
        ("X", " padded", "surrounding blanks"),
        ("1X", "v", "not a shell variable name"),
        ("X-Y", "v", "not a shell variable name"),
        ("X", "two\nlines", "'\\n'"),
    ],
)
def test_render_env_rejects_values_deepspeed_would_mangle(key, value, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        render_env({key: value})


def test_derive_env_cpu_pins_interfaces_and_threads(inventory_dir):
    facts = [
        NodeFacts("a", "cpu", 0, 2, "eth0", "10.0.0.1", "/opt/v", "/opt/ext", 8, {}),
        NodeFacts("b", "cpu", 0, 4, "eth0", "10.0.0.2", "/opt/v", "/opt/ext", 8, {}),
    ]
    env = derive_env(facts)
    assert env["PATH"].startswith("/opt/v/bin:")
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cpus / 4 slots on the busiest node
    assert env["ACCELERATE_USE_CPU"] == "true"  # else accelerate's ranks each see world size 1
    assert env["TORCH_EXTENSIONS_DIR"] == "/opt/ext"  # as recorded, not derived


def machine_node(host: str, cpus: int, slots: int, boot_id: str) -> NodeFacts:
    return NodeFacts(
        host, "cpu", 0, slots, "eth0", "", "/opt/v", "/opt/ext", cpus, {}, boot_id=boot_id
    )


BOOT_A = "5f0c2a8e-3d1b-4c7e-9a61-0b2f4e8d7c13"
BOOT_B = "0b2f4e8d-9a61-4c7e-3d1b-5f0c2a8e7c13"


@pytest.mark.parametrize(
    ("nodes", "threads"),
    [
        # 3 local nodes on 2 cores: one thread a rank, not each node's 2 cpus // 1 slot
        ([("n1", 2, 1, BOOT_A), ("n2", 2, 1, BOOT_A), ("n3", 2, 1, BOOT_A)], 1),
        ([("n1", 8, 2, BOOT_A), ("n2", 8, 2, BOOT_A)], 2),
        ([("n1", 16, 1, BOOT_A), ("n2", 16, 1, BOOT_A), ("n3", 16, 1, BOOT_A)], 5),
        ([(f"n{i}", 2, 1, BOOT_A) for i in range(16)], 1),
        # machines of their own (EC2, bare metal): each its own cpus // slots, the least
        ([("a", 8, 2, BOOT_A), ("b", 8, 4, BOOT_B)], 2),
        # two containers on each of two machines
        (
            [
                ("a1", 16, 2, BOOT_A),
                ("a2", 16, 2, BOOT_A),
                ("b1", 8, 1, BOOT_B),
                ("b2", 8, 1, BOOT_B),
            ],
            4,
        ),
        # facts from before the boot id: every node a machine of its own, as before
        ([("n1", 2, 1, ""), ("n2", 2, 1, ""), ("n3", 2, 1, "")], 2),
        ([("n1", 1, 4, BOOT_A)], 1),
    ],
)
def test_omp_threads_share_a_machines_cores_among_the_ranks_on_it(nodes, threads):
    facts = [machine_node(*node) for node in nodes]
    assert omp_threads(facts) == threads
    assert derive_env(facts)["OMP_NUM_THREADS"] == str(threads)
    # the user's dscluster_extra_env still has the last word
    assert derive_env(facts, {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def test_boot_id_is_read_from_the_recorded_accelerators_fact():
    data = {
        "accelerators": {"kind": "cpu", "count": 0, "cpus": 2, "boot_id": BOOT_A},
        "versions": {"venv": "/opt/v", "torch_extensions_dir": "/opt/ext"},
    }
    assert NodeFacts.from_json("n1", data).boot_id == BOOT_A
    del data["accelerators"]["boot_id"]  # facts recorded before it
    assert NodeFacts.from_json("n1", data).boot_id == ""
    data["accelerators"]["boot_id"] = ["x"]
    with pytest.raises(DsclusterError, match=r"accelerators.boot_id is \['x'\], not text"):
        NodeFacts.from_json("n1", data)


def test_derive_env_no_interface_pin_when_names_differ():
    facts = [
        NodeFacts("a", "cuda", 4, 1, "eth0", "", "/opt/v", "/opt/ext", 8, {}),
        NodeFacts("b", "cuda", 4, 1, "ens5", "", "/opt/v", "/opt/ext", 8, {}),
    ]
    env = derive_env(facts)
    assert "NCCL_SOCKET_IFNAME" not in env
    assert "OMP_NUM_THREADS" not in env
    assert "ACCELERATE_USE_CPU" not in env  # GPU nodes


def test_derive_env_refuses_different_venvs():
    facts = [
        NodeFacts("a", "cpu", 0, 1, "eth0", "", "/opt/v", "/opt/ext", 2, {}),
        NodeFacts("b", "cpu", 0, 1, "eth0", "", "/opt/w", "/opt/ext", 2, {}),
    ]
    with pytest.raises(DsclusterError, match=r"different venv paths.*ml_stack_venv"):
        derive_env(facts)


def cpu_node(host: str, pycache: str) -> NodeFacts:
    return NodeFacts(
        host, "cpu", 0, 1, "eth0", "", "/opt/v", "/opt/ext", 2, {}, pycache_dir=pycache
    )


def test_pycache_prefix_is_the_recorded_one_when_every_node_has_it():
    env, warnings = derive_launch_env([cpu_node("a", "/opt/pyc"), cpu_node("b", "/opt/pyc")])
    assert env["PYTHONPYCACHEPREFIX"] == "/opt/pyc" and warnings == []
    # ml_stack_pycache_dir "" everywhere (or facts from before it): left out, nothing said
    env, warnings = derive_launch_env([cpu_node("a", ""), cpu_node("b", "")])
    assert "PYTHONPYCACHEPREFIX" not in env and warnings == []
    # the user's dscluster_extra_env has the last word
    env, _ = derive_launch_env([cpu_node("a", "/opt/pyc")], {"PYTHONPYCACHEPREFIX": "/x"})
    assert env["PYTHONPYCACHEPREFIX"] == "/x"


def test_pycache_prefix_left_out_naming_the_nodes_without_it():
    env, warnings = derive_launch_env(
        [cpu_node("a", "/opt/pyc"), cpu_node("b", ""), cpu_node("c", "")]
    )
    assert "PYTHONPYCACHEPREFIX" not in env
    assert warnings == [
        "no pycache_dir recorded for b, c: PYTHONPYCACHEPREFIX is left out, so every rank "
        "compiles what it imports again; run 'dscluster provision'"
    ]
    with pytest.raises(DsclusterError, match=r"different pycache_dir paths.*ml_stack_pycache_dir"):
        derive_launch_env([cpu_node("a", "/opt/pyc"), cpu_node("b", "/opt/other")])


def test_pycache_dir_read_from_the_ml_stack_fact(inventory_dir: pathlib.Path):
    for host in ("node-a", "node-b", "node-c"):
        data = json.loads((inventory_dir / "facts" / f"{host}.json").read_text())
        data["versions"]["pycache_dir"] = "/opt/dscluster/pycache"
        (inventory_dir / "facts" / f"{host}.json").write_text(json.dumps(data))
    files = write_launch_files(inventory.load(inventory_dir))
    env = dict(line.split("=", 1) for line in files.env_file.read_text().splitlines())
    assert env["PYTHONPYCACHEPREFIX"] == "/opt/dscluster/pycache"


def test_write_launch_files_heterogeneous_slots(inventory_dir: pathlib.Path):
    inv = inventory.load(inventory_dir)
    files = write_launch_files(inv)
    assert files.hostfile.read_text() == "node-a slots=4\nnode-b slots=2\nnode-c slots=2\n"
    assert files.world_size == 8
    env = dict(line.split("=", 1) for line in files.env_file.read_text().splitlines())
    assert env["PATH"].startswith("/opt/dscluster/venv/bin:")
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_missing_facts_names_host_and_writes_nothing(inventory_dir: pathlib.Path):
    (inventory_dir / "facts" / "node-b.json").unlink()
    (inventory_dir / "hostfile").write_text("old slots=1\n")
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="no recorded facts for node-b"):
        write_launch_files(inv)
    assert (inventory_dir / "hostfile").read_text() == "old slots=1\n"
    assert not (inventory_dir / ".deepspeed_env").exists()


def test_bad_env_value_writes_neither_file(inventory_dir: pathlib.Path):
    hosts = inventory_dir / "hosts.yml"
    hosts.write_text(
        hosts.read_text().replace(
            "dscluster_cpu_slots: 1",
            "dscluster_cpu_slots: 1\n    dscluster_extra_env: {MY_VAR: '$HOME'}",
        )
    )
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="MY_VAR"):
        write_launch_files(inv)
    assert not (inventory_dir / "hostfile").exists()
    assert not (inventory_dir / ".deepspeed_env").exists()


def test_zero_slot_accelerator_node_refused(inventory_dir: pathlib.Path):
    write_facts(inventory_dir / "facts", "node-c", cpu_slots=0)
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="node-c has slots=0"):
        write_launch_files(inv)
    assert not (inventory_dir / "hostfile").exists()


def test_incomplete_facts_are_an_error(inventory_dir: pathlib.Path):
    (inventory_dir / "facts" / "node-a.json").write_text('{"host": "node-a"}')
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="recorded facts of node-a are incomplete"):
        write_launch_files(inv)


# ---- facts built from recorded outputs: accelerators fact -> nccl_profile -> facts/<host>.json


def _parse_deepspeed_env(text: str) -> dict[str, str]:
    """`.deepspeed_env` read as DeepSpeed's runner does (see deepspeed_env.py's docstring): each
    line split once on '=', key and value stripped; values outside the safe set get quoted
    and then expanded by the remote shell, so they must not hold what the shell changes."""
    env = {}
    for line in text.splitlines():
        assert line and not line.startswith(("#", "export ")), line
        key, value = line.split("=", 1)
        assert key == key.strip() and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), line
        assert value == value.strip() and value, line
        assert not set(value) & set('$`"\\!'), line
        env[key] = value
    return env


def _fixture_node(
    tmp_path: pathlib.Path,
    name: str,
    *,
    nvidia_smi: str,
    fi_info: str,
    efa: tuple[str, ...],
    plugin_dir: pathlib.Path,
    ifname: str = "eth0",
) -> dict:
    """A node's facts/<host>.json as deepspeed_launcher's export.yml writes it, from recorded
    tool outputs run through the accelerators fact and nccl_profile."""
    recorded = outputs(nvidia_smi=fixture(nvidia_smi), fi_info_efa=fixture(fi_info), hostname=name)
    if ifname != "eth0":  # a test edit of the recorded `ip` output, not a recording
        recorded["ip_addr"], recorded["ip_route"] = rename_interface(
            recorded["ip_addr"], recorded["ip_route"], "eth0", ifname
        )
    acc = accelerators.build_fact(recorded, make_root(tmp_path / f"root-{name}", efa=efa))
    prof = nccl_profile.build_profile(acc, None, [str(plugin_dir)])
    return {
        "accelerators": acc,
        # what roles/nccl_env records in /etc/ansible/facts.d/nccl_env.fact
        "nccl_env": {k: prof[k] for k in ("profile", "env", "socket_ifname")},
        "interface": ifname,
    }


@pytest.fixture
def efa_cluster(tmp_path: pathlib.Path) -> pathlib.Path:
    inv = tmp_path / "inv"
    (inv / "facts").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  vars:\n    dscluster_cpu_slots: 1\n  children:\n"
        "    head:\n      hosts:\n        gpu-4: {}\n"
        "    workers:\n      hosts:\n        gpu-2: {}\n"
    )
    plugin = tmp_path / "opt-amazon-ofi-nccl-lib"
    plugin.mkdir()
    (plugin / "libnccl-net.so").write_text("")
    return inv


def _write_efa_nodes(inv: pathlib.Path, tmp_path: pathlib.Path, second_ifname: str = "eth0"):
    plugin = tmp_path / "opt-amazon-ofi-nccl-lib"
    nodes = {
        "gpu-4": _fixture_node(
            tmp_path,
            "gpu-4",
            nvidia_smi="nvidia-smi-L_4x_a100_mig.txt",
            fi_info="fi_info-p_efa-t_rdm_p4d_4x.txt",
            efa=("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"),
            plugin_dir=plugin,
        ),
        "gpu-2": _fixture_node(
            tmp_path,
            "gpu-2",
            nvidia_smi="nvidia-smi-L_2x_quadro_rtx4000.txt",
            fi_info="fi_info-p_efa_efa-direct_1x.txt",
            efa=("rdmap47s0",),
            plugin_dir=plugin,
            ifname=second_ifname,
        ),
    }
    for host, data in nodes.items():
        acc = data["accelerators"]
        write_facts(
            inv / "facts",
            host,
            kind=acc["kind"],
            count=acc["count"],
            accelerators=acc,
            nccl_env=data["nccl_env"],
            interface=data["interface"],
        )
    return nodes


def test_acceptance_4_and_2_gpu_efa_nodes_from_recorded_outputs(efa_cluster, tmp_path):
    nodes = _write_efa_nodes(efa_cluster, tmp_path)
    assert [n["nccl_env"]["profile"] for n in nodes.values()] == ["efa", "efa"]
    files = write_launch_files(inventory.load(efa_cluster))
    assert files.hostfile.read_text() == "gpu-4 slots=4\ngpu-2 slots=2\n"
    assert [
        DS_HOSTFILE_RE.match(line).groups() for line in files.hostfile.read_text().splitlines()
    ] == [
        ("gpu-4", "4"),
        ("gpu-2", "2"),
    ]
    assert files.world_size == 6
    env = _parse_deepspeed_env(files.env_file.read_text())
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["RDMAV_FORK_SAFE"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["LD_LIBRARY_PATH"].startswith(str(tmp_path / "opt-amazon-ofi-nccl-lib"))
    assert env["PATH"].startswith("/opt/dscluster/venv/bin:")
    assert "OMP_NUM_THREADS" not in env  # GPU nodes
    assert files.warnings == []


def test_acceptance_heterogeneous_interface_names_leave_keys_out_with_warning(
    efa_cluster, tmp_path
):
    _write_efa_nodes(efa_cluster, tmp_path, second_ifname="ens5")
    files = write_launch_files(inventory.load(efa_cluster))
    env = _parse_deepspeed_env(files.env_file.read_text())
    assert "NCCL_SOCKET_IFNAME" not in env  # each node's /etc/nccl.conf has its own
    assert "GLOO_SOCKET_IFNAME" not in env
    assert env["FI_PROVIDER"] == "efa"  # the same everywhere, still exported
    assert len(files.warnings) == 1
    assert files.warnings[0].startswith(
        "GLOO_SOCKET_IFNAME differs between nodes (gpu-4: eth0, gpu-2: ens5)"
    )


def test_cli_hostfile_prints_each_warning_on_one_line(efa_cluster, tmp_path, capsys):
    _write_efa_nodes(efa_cluster, tmp_path, second_ifname="ens5")
    from dscluster import cli  # noqa: PLC0415

    assert cli.main(["hostfile", "-i", str(efa_cluster)]) == 0
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1
    assert err_lines[0].startswith("warning: GLOO_SOCKET_IFNAME differs between nodes")


def test_node_without_nccl_env_fact_is_reported(efa_cluster, tmp_path):
    _write_efa_nodes(efa_cluster, tmp_path)
    data = json.loads((efa_cluster / "facts" / "gpu-2.json").read_text())
    del data["nccl_env"]
    (efa_cluster / "facts" / "gpu-2.json").write_text(json.dumps(data))
    files = write_launch_files(inventory.load(efa_cluster))
    env = _parse_deepspeed_env(files.env_file.read_text())
    assert "FI_PROVIDER" not in env
    assert files.warnings[0].startswith("no nccl_env fact for gpu-2")
    assert any(w.startswith("FI_PROVIDER differs between nodes") for w in files.warnings)


def test_old_facts_keep_the_interface_rule(inventory_dir: pathlib.Path):
    # conftest's facts carry no nccl_env (as before the nccl_env role): same as before.
    files = write_launch_files(inventory.load(inventory_dir))
    env = _parse_deepspeed_env(files.env_file.read_text())
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert files.warnings == []


def test_malformed_nccl_env_fact_is_an_error(inventory_dir: pathlib.Path):
    write_facts(inventory_dir / "facts", "node-a", kind="cuda", count=4, nccl_env=["eth0"])
    with pytest.raises(DsclusterError, match="recorded facts of node-a are incomplete"):
        write_launch_files(inventory.load(inventory_dir))


# ---- degraded clusters: nodes left out after `provision --allow-degraded` -----------------


def test_update_degraded_records_failures_and_clears_successes():
    before = {"node-b": {"reason": "unreachable", "since": "T0"}}
    after = update_degraded(
        before, failed={"node-c": "failed at 'x'"}, succeeded=["node-a"], now="T1"
    )
    assert after == {
        "node-b": {"reason": "unreachable", "since": "T0"},  # not run on: kept as it was
        "node-c": {"reason": "failed at 'x'", "since": "T1"},
    }
    again = update_degraded(after, failed={"node-b": "still down"}, succeeded=[], now="T2")
    assert again["node-b"] == {"reason": "still down", "since": "T0"}  # first failure kept
    assert update_degraded(after, failed={}, succeeded=["node-b", "node-c"], now="T3") == {}
    assert before == {"node-b": {"reason": "unreachable", "since": "T0"}}  # input untouched


def test_degraded_record_leaves_nodes_out_with_a_warning(inventory_dir: pathlib.Path):
    inv = inventory.load(inventory_dir)
    (inventory_dir / "facts" / "node-b.json").unlink()  # an excluded node needs no facts
    write_degraded(inv, {"node-b": {"reason": "unreachable", "since": "T0"}})
    files = write_launch_files(inv)
    assert files.hostfile.read_text() == "node-a slots=4\nnode-c slots=2\n"
    assert [f.host for f in files.facts] == ["node-a", "node-c"]
    warning = files.warnings[0]
    assert warning.startswith("degraded cluster: node-b left out of the hostfile")
    assert "node-b: unreachable" in warning and "dscluster provision -i" in warning
    # an empty record removes the file, and the next hostfile has every node again
    write_facts(inventory_dir / "facts", "node-b", kind="cuda", count=2)
    write_degraded(inv, {})
    assert not (inventory_dir / "degraded.json").exists()
    files = write_launch_files(inv)
    assert files.hostfile.read_text().splitlines()[1] == "node-b slots=2"
    assert files.warnings == []


def test_degraded_head_or_every_node_is_refused_and_nothing_written(inventory_dir: pathlib.Path):
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match=r"the head node-a failed .*cannot be left out"):
        write_launch_files(inv, excluded={"node-a": {"reason": "down"}})
    with pytest.raises(DsclusterError, match="every node failed"):
        check_degraded(["a", "b"], "x", {"a": "down", "b": "down"})
    assert not (inventory_dir / "hostfile").exists()


def test_broken_degraded_record_is_an_error(inventory_dir: pathlib.Path):
    (inventory_dir / "degraded.json").write_text('{"excluded": ["node-b"]}')
    with pytest.raises(DsclusterError, match=r"degraded\.json is not a degraded-nodes record"):
        write_launch_files(inventory.load(inventory_dir))


# ---- `dscluster provision`: what it writes after a run, given the run's per-host outcome ---


def run_provision(monkeypatch, inv_dir: pathlib.Path, result, *flags: str):
    """cmd_provision with the playbook run replaced by its outcome (the e2e runs it for real)."""
    from dscluster import cli, runner  # noqa: PLC0415

    monkeypatch.setattr(runner, "run_playbook", lambda *a, **kw: result)
    return cli.main(["provision", "-i", str(inv_dir), *flags])


def outcome(**failed: str):
    from dscluster.runner import HostSummary, PlaybookResult  # noqa: PLC0415

    hosts = {h: HostSummary(ok=5) for h in ("node-a", "node-b", "node-c")}
    failures = []
    for host, task in failed.items():
        hosts[host.replace("_", "-")] = HostSummary(ok=1, unreachable=1)
        failures.append((host.replace("_", "-"), task, "Failed to connect to the host via ssh"))
    return PlaybookResult(
        status="failed" if failed else "successful",
        rc=2 if failed else 0,
        hosts=hosts,
        failures=failures,
    )


def test_provision_failure_names_the_node_and_leaves_launch_files(
    monkeypatch, capsys, inventory_dir: pathlib.Path
):
    (inventory_dir / "hostfile").write_bytes(b"old slots=1\n")
    (inventory_dir / ".deepspeed_env").write_bytes(b"PATH=/old\n")
    rc = run_provision(monkeypatch, inventory_dir, outcome(node_c="Gathering Facts"))
    assert rc == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("dscluster: error: provisioning (site.yml) failed on node-c: ")
    assert "hostfile and .deepspeed_env left unchanged" in line and "--allow-degraded" in line
    assert (inventory_dir / "hostfile").read_bytes() == b"old slots=1\n"
    assert (inventory_dir / ".deepspeed_env").read_bytes() == b"PATH=/old\n"
    assert not (inventory_dir / "degraded.json").exists()


def test_provision_allow_degraded_then_full_success_clears_it(
    monkeypatch, capsys, inventory_dir: pathlib.Path
):
    rc = run_provision(
        monkeypatch, inventory_dir, outcome(node_b="Gathering Facts"), "--allow-degraded"
    )
    assert rc == 0
    out, err = capsys.readouterr()
    assert "provisioned 2 of 3 hosts" in out and "(6 slots on 2 hosts)" in out
    assert "warning: degraded cluster: node-b left out" in err
    assert (inventory_dir / "hostfile").read_text() == "node-a slots=4\nnode-c slots=2\n"
    record = json.loads((inventory_dir / "degraded.json").read_text())["excluded"]
    assert (
        list(record) == ["node-b"]
        and "unreachable at 'Gathering Facts'" in record["node-b"]["reason"]
    )
    # later hostfiles keep node-b out, with the warning each time
    assert run_hostfile(capsys, inventory_dir).count("warning:") == 1
    # the head cannot be left out: nothing changes
    rc = run_provision(
        monkeypatch, inventory_dir, outcome(node_a="Gathering Facts"), "--allow-degraded"
    )
    assert rc == 1
    assert "the head node-a failed" in capsys.readouterr().err
    assert degraded_hosts(inventory_dir) == ["node-b"]
    # a partial run (--tags) that succeeds everywhere keeps it: the node is not provisioned yet
    assert run_provision(monkeypatch, inventory_dir, outcome(), "--tags", "preflight") == 0
    assert "warning: degraded cluster: node-b left out" in capsys.readouterr().err
    assert degraded_hosts(inventory_dir) == ["node-b"]
    # a full run that succeeds on every node clears the record and writes the full hostfile
    assert run_provision(monkeypatch, inventory_dir, outcome()) == 0
    out = capsys.readouterr().out
    assert "degraded record cleared: node-b back in the hostfile" in out
    assert "(8 slots on 3 hosts)" in out
    assert not (inventory_dir / "degraded.json").exists()
    assert (inventory_dir / "hostfile").read_text().count("slots=") == 3


def run_hostfile(capsys, inv_dir: pathlib.Path) -> str:
    from dscluster import cli  # noqa: PLC0415

    assert cli.main(["hostfile", "-i", str(inv_dir)]) == 0
    err = capsys.readouterr().err
    assert "warning: degraded cluster: node-b left out" in err
    assert "node-b" not in (inv_dir / "hostfile").read_text()
    return err


def degraded_hosts(inv_dir: pathlib.Path) -> list[str]:
    return list(json.loads((inv_dir / "degraded.json").read_text())["excluded"])


# ---- issue 14: natural YAML in extra_env, hand-edited files, one transaction ----------------


def _with_extra_env(inventory_dir: pathlib.Path, yaml_value: str) -> inventory.Inventory:
    hosts = inventory_dir / "hosts.yml"
    hosts.write_text(
        hosts.read_text().replace(
            "dscluster_cpu_slots: 1",
            f"dscluster_cpu_slots: 1\n    dscluster_extra_env: {yaml_value}",
        )
    )
    return inventory.load(inventory_dir)


def test_extra_env_numbers_and_bools_become_text(inventory_dir: pathlib.Path):
    inv = _with_extra_env(inventory_dir, "{OMP_NUM_THREADS: 4, NCCL_IB_DISABLE: true, LR: 0.5}")
    files = write_launch_files(inv)
    env = parse_env_file(files.env_file.read_text(), "x")
    assert (env["OMP_NUM_THREADS"], env["NCCL_IB_DISABLE"], env["LR"]) == ("4", "1", "0.5")


@pytest.mark.parametrize(
    ("yaml_value", "needle"),
    [
        ("{OMP_NUM_THREADS: null}", "OMP_NUM_THREADS is null"),
        ("{A: {b: 1}}", "A is a mapping"),
        ("[A=1]", "(a list)"),
        ("{1X: 4}", "key '1X' is not an environment variable name"),
    ],
)
def test_extra_env_refused_naming_the_key(inventory_dir: pathlib.Path, yaml_value, needle):
    # Refused when the inventory is read (rules.yml, as validate_inventory) or, for an
    # inventory object made otherwise, when the launch files are rendered.
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        write_launch_files(_with_extra_env(inventory_dir, yaml_value))
    assert not (inventory_dir / "hostfile").exists()


def test_launch_files_are_one_transaction(inventory_dir: pathlib.Path):
    (inventory_dir / "hostfile").write_text("# by hand\nnode-a slots=1\n")
    (inventory_dir / ".deepspeed_env").mkdir()
    with pytest.raises(DsclusterError, match="deepspeed_env: it is a directory"):
        write_launch_files(inventory.load(inventory_dir))
    assert (inventory_dir / "hostfile").read_text() == "# by hand\nnode-a slots=1\n"


def test_parse_hostfile_as_deepspeed_reads_it():
    text = "# by hand\n\nn1 slots=2\n  n2\tslots=8  \n"
    assert hostfile.parse_hostfile(text, "hf") == [("n1", 2), ("n2", 8)]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("n1 slots=2\nn2 slots=two\n", "hf line 2: 'n2 slots=two' is not 'host slots=N'"),
        ("n1 slots=2x\n", "line 1"),
        ("n1 slots=0\n", "slots must be a whole number 1-1024"),
        ("n1 slots=99999999999999\n", "slots must be a whole number 1-1024"),
        ("n1 slots=1\nn1 slots=2\n", "line 2: host n1 appears twice"),
        ("fe80::1 slots=1\n", "IPv6 literals cannot go in a hostfile"),
        ("# nothing\n", "lists no hosts"),
        ("n1\n", "is not 'host slots=N'"),
    ],
)
def test_parse_hostfile_refuses_with_file_line_and_fix(text, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)) as info:
        hostfile.parse_hostfile(text, "hf")
    assert str(info.value).startswith("hf")  # the file (and line) first


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "holds a list, not a mapping"),
        (b"{", "not valid JSON"),
        (b"1" * 5000, "a huge number"),
    ],
)
def test_facts_files_refused_in_one_line(tmp_path: pathlib.Path, data, needle):
    path = tmp_path / "n1.json"
    path.write_bytes(data)
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        read_facts_file(path, "n1")
