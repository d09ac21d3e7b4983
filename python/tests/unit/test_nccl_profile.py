"""nccl_profile.py: NCCL_SOCKET_IFNAME matching and the fabric profiles, on facts built from
recorded outputs by the accelerators fact (fixtures/accelerators/SOURCES.md)."""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import sys

import pytest

from .. import rolefiles
from .accel_fixtures import (
    NCCL_PROFILE,
    accelerators,
    fixture,
    make_root,
    nccl_profile,
    outputs,
)

TWO_NICS = [
    {"name": "eth0", "ipv4": ["172.18.0.2"], "state": "UP"},
    {"name": "ib0", "ipv4": ["10.0.0.5"], "state": "UP"},
]


def fact_from(tmp_path: pathlib.Path, efa=(), ib=(), **recorded) -> dict:
    return accelerators.build_fact(outputs(**recorded), make_root(tmp_path, efa=efa, ib=ib))


@pytest.mark.parametrize(
    ("spec", "name", "selected"),
    [
        # Examples from the NCCL user guide (NCCL_SOCKET_IFNAME) and socket.cc semantics.
        ("eth", "eth0", True),
        ("eth", "eth1", True),
        ("eth", "ens5", False),
        ("=eth0", "eth0", True),
        ("=eth0", "eth01", False),
        ("eth0", "eth01", True),
        ("^docker", "docker0", False),
        ("^docker", "eth0", True),
        ("^docker,lo", "lo", False),
        ("^=docker0", "docker0", False),
        ("^=docker0", "docker01", True),
        ("ens,eth", "ens5", True),
        ("eth0:1234", "eth0", True),
        ("^", "eth0", False),
        ("=eth0,ib0", "ib0", True),
    ],
)
def test_ifname_matches_like_nccl(spec, name, selected):
    assert nccl_profile.ifname_matches(spec, name) is selected


def test_check_ifname_names_node_and_its_interfaces():
    fact = {"hostname": "gpu-a", "nics": TWO_NICS}
    assert nccl_profile.check_ifname("ib", fact) == ["ib0"]
    assert nccl_profile.check_ifname("^lo", fact) == ["eth0", "ib0"]
    with pytest.raises(nccl_profile.ProfileError) as info:
        nccl_profile.check_ifname("ens5", fact)
    assert str(info.value) == (
        "gpu-a: NCCL_SOCKET_IFNAME=ens5 matches no interface with an IPv4 address; "
        "this node has: eth0 (172.18.0.2), ib0 (10.0.0.5)"
    )


def test_check_ifname_ignores_interfaces_without_address():
    fact = {"hostname": "n", "nics": [*TWO_NICS, {"name": "ens6", "ipv4": [], "state": "DOWN"}]}
    with pytest.raises(nccl_profile.ProfileError, match=r"==ens6 matches no interface"):
        nccl_profile.check_ifname("=ens6", fact)


def test_efa_profile_from_recorded_four_gpu_efa_node(tmp_path):
    plugin = tmp_path / "ofi"
    plugin.mkdir()
    (plugin / "libnccl-net.so").write_text("")
    fact = fact_from(
        tmp_path / "root",
        efa=("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"),
        nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"),
        fi_info_efa=fixture("fi_info-p_efa-t_rdm_p4d_4x.txt"),
    )
    prof = nccl_profile.build_profile(fact, None, [str(plugin)])
    assert prof["profile"] == "efa"
    env = prof["env"]
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["RDMAV_FORK_SAFE"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(plugin)
    assert not any(k.startswith("NCCL_IB_") for k in env)
    assert prof["nccl_conf"] == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert prof["socket_ifname"] == "eth0"


def test_efa_profile_without_plugin_sets_no_library_path(tmp_path):
    fact = fact_from(
        tmp_path / "root",
        efa=("rdmap47s0",),
        nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"),
        fi_info_efa=fixture("fi_info-p_efa_efa-direct_1x.txt"),
    )
    prof = nccl_profile.build_profile(fact, None, [str(tmp_path / "nowhere")])
    assert prof["profile"] == "efa"
    assert "LD_LIBRARY_PATH" not in prof["env"]


def test_ib_profile_names_only_infiniband_hcas_exactly(tmp_path):
    fact = fact_from(
        tmp_path,
        ib=(("mlx5_0", "InfiniBand"), ("mlx5_1", "InfiniBand"), ("mlx5_2", "Ethernet")),
        nvidia_smi=fixture("nvidia-smi-L_8x_h100.txt"),
    )
    prof = nccl_profile.build_profile(fact)
    assert prof["profile"] == "ib"
    assert prof["env"]["NCCL_IB_DISABLE"] == "0"
    assert prof["env"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert "NCCL_IB_GID_INDEX" not in prof["env"]


def test_roce_profile_sets_gid_index(tmp_path):
    fact = fact_from(
        tmp_path,
        ib=(("mlx5_0", "Ethernet"),),
        nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"),
    )
    prof = nccl_profile.build_profile(fact)
    assert prof["profile"] == "roce"
    assert prof["env"]["NCCL_IB_HCA"] == "=mlx5_0"
    assert prof["env"]["NCCL_IB_GID_INDEX"] == "3"


def test_ethernet_profile_disables_ib(tmp_path):
    fact = fact_from(tmp_path, nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"))
    prof = nccl_profile.build_profile(fact)
    assert prof["profile"] == "ethernet"
    assert prof["env"] == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_DISABLE": "1",
    }


def test_cpu_profile_is_gloo_only(tmp_path):
    fact = fact_from(tmp_path, lspci=fixture("lspci-nn_buildhost_virtio_none.txt"))
    prof = nccl_profile.build_profile(fact)
    assert prof["profile"] == "cpu"
    assert prof["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert prof["nccl_conf"] == {}


def test_gaudi_profile_plain_and_over_efa(tmp_path):
    plain = fact_from(tmp_path / "a", hl_smi=fixture("hl-smi-L-i_gaudi2_hl225.txt"))
    prof = nccl_profile.build_profile(plain)
    assert prof["profile"] == "hpu"
    assert prof["env"] == {"GLOO_SOCKET_IFNAME": "eth0", "HCCL_SOCKET_IFNAME": "eth0"}
    with_efa = fact_from(
        tmp_path / "b",
        efa=("rdmap0s31",),
        hl_smi=fixture("hl-smi-L-i_gaudi2_hl225.txt"),
        fi_info_efa=fixture("fi_info_hpc6a_efa_entries.txt"),
    )
    env = nccl_profile.build_profile(with_efa)["env"]
    assert env["HCCL_OVER_OFI"] == "1"
    assert env["FI_PROVIDER"] == "efa"
    assert "NCCL_SOCKET_IFNAME" not in env


def test_socket_interface_falls_back_when_default_route_has_no_address():
    fact = {"kind": "cpu", "hostname": "n", "nics": TWO_NICS, "default_interface": "bond0"}
    assert nccl_profile.build_profile(fact)["socket_ifname"] == "eth0"


def test_overrides_apply_and_validate(tmp_path):
    fact = fact_from(tmp_path, nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"))
    fact["nics"] = TWO_NICS
    prof = nccl_profile.build_profile(
        fact,
        {"socket_ifname": "^eth", "env": {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": None}},
    )
    assert prof["env"]["NCCL_SOCKET_IFNAME"] == "^eth"
    assert prof["env"]["GLOO_SOCKET_IFNAME"] == "ib0"
    assert prof["env"]["NCCL_DEBUG"] == "WARN"
    assert "NCCL_IB_DISABLE" not in prof["env"]
    assert prof["nccl_conf"]["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"profile": "infiniband"}, "unknown NCCL profile 'infiniband'"),
        ({"profile": "efa"}, "profile efa forced but this node has no EFA device"),
        ({"profile": "ib"}, "profile ib forced but this node has no InfiniBand HCA"),
        ({"profile": "hpu"}, "profile hpu forced"),
        ({"socket_ifname": "ens5"}, "NCCL_SOCKET_IFNAME=ens5 matches no interface"),
        ({"color": "red"}, "unknown NCCL override key(s) color"),
        ({"env": {"1BAD": "x"}}, "is not a variable name"),
    ],
)
def test_bad_overrides_fail_naming_the_node(tmp_path, overrides, needle):
    fact = fact_from(tmp_path, nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"))
    fact["hostname"] = "gpu-b"
    with pytest.raises(nccl_profile.ProfileError) as info:
        nccl_profile.build_profile(fact, overrides)
    assert str(info.value).startswith("gpu-b: ")
    assert needle in str(info.value)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The script's CLI, as it runs installed on the node."""
    return subprocess.run(
        [sys.executable, str(NCCL_PROFILE), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_profile_and_check_ifname(tmp_path):
    fact = fact_from(tmp_path / "root", nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"))
    path = tmp_path / "fact.json"
    path.write_text(json.dumps(fact))
    ok = run_cli("profile", "--fact", str(path), "--overrides", '{"env": {"NCCL_DEBUG": "INFO"}}')
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert set(result) >= {"profile", "env", "nccl_conf", "socket_ifname"}
    assert result["env"]["NCCL_DEBUG"] == "INFO"
    from_stdin = run_cli("check-ifname", "eth", "--fact", "-", stdin=json.dumps(fact))
    assert (from_stdin.returncode, from_stdin.stdout.strip()) == (0, "eth0")
    bad = run_cli("check-ifname", "ens5", "--fact", str(path))
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("node: NCCL_SOCKET_IFNAME=ens5 matches no interface")
    forced = run_cli("profile", "--fact", str(path), "--overrides", '{"profile": "efa"}')
    assert forced.returncode == 1
    assert len(forced.stderr.strip().splitlines()) == 1
    assert forced.stdout == ""


def run_state(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return run_cli("state", *args, stdin=stdin)


def test_cli_state_reads_the_profile_and_its_interfaces_in_one_run(tmp_path):
    fact = fact_from(tmp_path / "root", nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"))
    ok = run_state(
        "--fact", "-", "--overrides", '{"env": {"NCCL_DEBUG": "INFO"}}', stdin=json.dumps(fact)
    )
    assert ok.returncode == 0, ok.stderr
    state = json.loads(ok.stdout)
    assert state == {
        "profile": nccl_profile.build_profile(fact, {"env": {"NCCL_DEBUG": "INFO"}}),
        "error": None,
    }


def test_cli_state_says_why_a_profile_cannot_work(tmp_path):
    fact = fact_from(tmp_path / "root", nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"))
    fact["hostname"] = "gpu-b"
    forced = run_state("--fact", "-", "--overrides", '{"profile": "ib"}', stdin=json.dumps(fact))
    assert forced.returncode == 0, forced.stderr
    state = json.loads(forced.stdout)
    assert state["profile"] is None
    assert state["error"].startswith("gpu-b: profile ib forced but this node has no InfiniBand HCA")
    assert set(state) == {"profile", "error"}
    not_json = run_state("--fact", "-", "--overrides", "{", stdin=json.dumps(fact))
    assert not_json.returncode == 1
    assert not_json.stderr.strip().splitlines() == [not_json.stderr.strip()]
    assert not_json.stderr.startswith("gpu-b: --overrides is not JSON")


def run_nccl_env_files(node: pathlib.Path, fact: dict, overrides: dict) -> dict:
    """tests/unit/playbooks/nccl_env_files.yml: the module as the nccl_env role runs it, into
    `node` (script, nccl.conf, fact); each run's result by name."""
    playbook = pathlib.Path(__file__).parent / "playbooks" / "nccl_env_files.yml"
    extravars = {
        "dir": str(node),
        "fact": fact,
        "overrides": overrides,
        "script": NCCL_PROFILE.read_text(),
    }
    rc, result, out = rolefiles.run_module_play(playbook, extravars)
    assert rc == 0 and result is not None, out[-3000:]
    return json.loads(base64.b64decode(result["b64"]))


def test_nccl_env_files_computes_the_profile_and_writes_it_in_one_run(tmp_path):
    """plugins/modules/nccl_env_files.py: the profile `nccl_profile.py state` prints, then the
    script, nccl.conf (NCCL_* only, sorted as the role's Jinja dictsort sorted it) and the fact
    (as to_nice_json wrote it) written once; the same run again writes nothing; check mode shows
    the diff and writes nothing; a profile that cannot work fails naming the node and writes
    nothing."""
    fact = fact_from(tmp_path / "root", nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"))
    overrides = {"env": {"NCCL_DEBUG": "INFO"}}
    node = tmp_path / "node"
    node.mkdir()
    result = run_nccl_env_files(node, fact, overrides)
    cli = run_state("--fact", "-", "--overrides", json.dumps(overrides), stdin=json.dumps(fact))
    assert cli.returncode == 0, cli.stderr
    profile = json.loads(cli.stdout)["profile"]

    first = result["first"]
    assert first.get("failed") is not True and first["changed"] is True, first
    assert first["profile"] == profile
    script, conf, fact_file = (node / "opt/bin/nccl_profile.py", node / "nccl.conf",
                               node / "facts.d/nccl_env.fact")  # fmt: skip
    assert first["written"] == [
        str(node / "opt"), str(node / "opt/bin"), str(node / "facts.d"),
        str(script), str(conf), str(fact_file),
    ]  # fmt: skip
    assert script.read_text() == NCCL_PROFILE.read_text()
    assert [oct(p.stat().st_mode & 0o777) for p in (script, conf, fact_file)] == [
        "0o755", "0o644", "0o644",
    ]  # fmt: skip
    lines = conf.read_text().splitlines()
    assert lines[:2] == [
        "# Managed by dscluster (nccl_env): profile ethernet. NCCL_* only;",
        f"# the full environment is in {fact_file}.",
    ]
    keys = sorted(profile["nccl_conf"], key=str.lower)
    assert lines[2:] == [f"{k}={profile['nccl_conf'][k]}" for k in keys]
    assert "NCCL_DEBUG=INFO" in lines
    assert first["conf_text"] == conf.read_text() and conf.read_text().endswith("\n")
    recorded = {k: profile[k] for k in ("profile", "env", "socket_ifname", "interfaces")}
    recorded["nccl_conf"] = str(conf)
    assert fact_file.read_text() == json.dumps(recorded, indent=4, sort_keys=True) + "\n"

    second = result["second"]
    assert second["changed"] is False and second["written"] == [], second

    checked = result["checked"]
    assert checked["changed"] is True and checked["written"] == [str(conf), str(fact_file)]
    assert "NCCL_DEBUG=TRACE" in checked["diff"][0]["after"]
    assert "NCCL_DEBUG=INFO" in conf.read_text()  # check mode wrote nothing

    forced = result["forced"]
    state = nccl_profile.node_state(fact, {"profile": "ib"}, nccl_profile.OFI_NCCL_DIRS)
    assert forced["failed"] is True and forced["written"] == []
    assert forced["msg"] == nccl_profile.named(state["error"], "n1")
    assert "no InfiniBand HCA" in forced["msg"] and forced["msg"].count("\n") == 0
    assert "NCCL_DEBUG=INFO" in conf.read_text()


def test_nccl_env_files_refuses_a_link_for_nccl_conf(tmp_path):
    """A link where nccl.conf goes (the training user cannot make one in /etc, but the module
    must not follow one): refused naming it, its target left alone, the fact not written."""
    fact = fact_from(tmp_path / "root", nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"))
    node = tmp_path / "node"
    node.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("root's\n")
    (node / "nccl.conf").symlink_to(target)
    first = run_nccl_env_files(node, fact, {})["first"]
    assert first["failed"] is True and str(node / "nccl.conf") in first["msg"], first
    assert first["msg"].startswith("nccl_env_files: ") and "\n" not in first["msg"]
    assert target.read_text() == "root's\n"
    assert not (node / "facts.d" / "nccl_env.fact").exists()
