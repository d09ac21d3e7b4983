"""Launch builders: DeepSpeed's include/exclude rules, the argv of each launcher, the MPI
hostfile, heterogeneous slots, quoting, one-line errors."""

from __future__ import annotations

import argparse
import shlex
import subprocess

import pytest

from dscluster.errors import DsclusterError
from dscluster.hostfile import render_hostfile
from dscluster.launch import (
    LAUNCH_TIME,
    add_parsers,
    build_plan,
    lost_nodes,
    parse_node_specs,
    render_mpi_hostfile,
    select_resources,
)

POOL = {"h1": 4, "h2": 2, "h3": 1}
ENV = "PATH=/opt/v/bin:/usr/bin\nOMP_NUM_THREADS=2\nNCCL_SOCKET_IFNAME=eth0\n"


def plan(launcher: str, program=("train.py", "--lr", "0.1"), **kw):
    args = {
        "launcher": launcher,
        "run_id": "launch-1",
        "job_dir": "/shared/dscluster/jobs/launch-1",
        "head": "h1",
        "venv": "/opt/v",
        "pool": POOL,
        "accelerators": dict.fromkeys(POOL, "cuda"),
        "hostfile_text": render_hostfile(POOL.items()),
        "env_text": ENV,
        "program": list(program),
    }
    args.update(kw)
    return build_plan(**args)


# --- DeepSpeed's include/exclude semantics (deepspeed/launcher/runner.py) ---------------------


def test_node_specs_as_deepspeeds_parse_node_config_list():
    assert parse_node_specs("h1:0,2@h2", "--include") == {"h1": [0, 2], "h2": []}
    # a host named twice gets the union of its slots, sorted, no repeats
    assert parse_node_specs("h1:3@h1:1,3", "--include") == {"h1": [1, 3]}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, {"h1": [0, 1, 2, 3], "h2": [0, 1], "h3": [0]}),
        # docstring example: all slots of one host, chosen slots of another
        ({"include": "h1@h2:1"}, {"h1": [0, 1, 2, 3], "h2": [1]}),
        # result keeps hostfile order, not the order the filter names hosts
        ({"include": "h3@h1:2"}, {"h1": [2], "h3": [0]}),
        ({"exclude": "h2"}, {"h1": [0, 1, 2, 3], "h3": [0]}),
        ({"exclude": "h1:0,3"}, {"h1": [1, 2], "h2": [0, 1], "h3": [0]}),
        # a host whose every slot is excluded disappears
        ({"exclude": "h2:0,1@h3"}, {"h1": [0, 1, 2, 3]}),
        ({"num_nodes": 2}, {"h1": [0, 1, 2, 3], "h2": [0, 1]}),
        ({"num_nodes": 2, "num_gpus": 1}, {"h1": [0], "h2": [0]}),
    ],
)
def test_select_resources_follows_deepspeed(kw, expected):
    assert select_resources(POOL, **kw) == expected
    assert list(select_resources(POOL, **kw)) == list(expected)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"include": "h9"}, "--include names host 'h9', which is not in the hostfile (h1, h2, h3)"),
        ({"exclude": "h1@nope:0"}, "--exclude names host 'nope'"),
        ({"include": "h2:2"}, "--include names slot 2 on h2, which has slots 0-1"),
        ({"include": "h1", "exclude": "h2"}, "--include and --exclude are mutually exclusive"),
        ({"include": "h1", "num_nodes": 1}, "cannot be combined with --include/--exclude"),
        ({"include": "h1:x"}, "slots in 'h1:x' are not integers"),
        ({"include": "h1:0:1"}, "more than one ':'"),
        ({"exclude": "h1@h2@h3"}, "leaves no slot to run on"),
        ({"num_gpus": 3}, "--num-gpus 3 is more than the slots of h2 (2), h3 (1)"),
        ({"num_nodes": 0}, "--num-nodes 0"),
    ],
)
def test_select_resources_errors_are_one_line(kw, message):
    with pytest.raises(DsclusterError) as exc:
        select_resources(POOL, **kw)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


# --- deepspeed ----------------------------------------------------------------------------


def test_deepspeed_passes_filters_verbatim():
    p = plan("deepspeed", include="h1:0,1@h3")
    assert p.argv == [
        "/opt/v/bin/deepspeed", "--hostfile", "hostfile", "--launcher", "pdsh",
        "--master_addr", "h1", "--master_port", "29500",
        "--include", "h1:0,1@h3", "train.py", "--lr", "0.1",
    ]  # fmt: skip
    assert p.world_size == 3
    assert p.files["hostfile"][0] == "h1 slots=4\nh2 slots=2\nh3 slots=1\n"


def test_deepspeed_master_is_first_selected_host_and_filter_is_checked_first():
    p = plan("deepspeed", exclude="h1", master_port=29511)
    assert p.argv[p.argv.index("--master_addr") + 1] == "h2"
    assert "29511" in p.argv
    with pytest.raises(DsclusterError, match="host 'h4'"):
        plan("deepspeed", exclude="h4")


@pytest.mark.parametrize("arg", ["a;b", "$HOME", "it's", "50%n", 'a"b', ""])
def test_deepspeed_refuses_args_its_pdsh_runner_would_change(arg):
    with pytest.raises(DsclusterError, match="use --launcher torchrun or mpi"):
        plan("deepspeed", program=["train.py", arg])


def test_deepspeed_keeps_args_with_spaces_and_the_launch_time():
    p = plan("deepspeed", program=["train.py", "--name", "a b", "--t", LAUNCH_TIME])
    script = p.files["launch.sh"][0]
    assert "train.py --name 'a b' --t \"$DSCLUSTER_LAUNCH_TIME\"" in script
    # the deepspeed launcher reads the head's ./.deepspeed_env and exports it to every rank
    assert 'echo "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" >> .deepspeed_env' in script


# --- torchrun -----------------------------------------------------------------------------


def test_torchrun_heterogeneous_slots_each_node_its_own_nproc():
    p = plan("torchrun", pool={"h1": 4, "h2": 2}, hostfile_text="h1 slots=4\nh2 slots=2\n")
    assert p.argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "h1,h2"]
    assert p.argv[6:9] == ["bash", "/shared/dscluster/jobs/launch-1/torchrun_node.sh", "%h"]
    script = p.files["torchrun_node.sh"][0]
    common = (
        "--nnodes 2 --nproc-per-node {n} --rdzv-backend c10d --rdzv-endpoint h1:29500 "
        "--rdzv-id launch-1 --rdzv-conf is_host={host} --max-restarts 0 train.py --lr 0.1 ;;"
    )
    assert f"  h1) exec /opt/v/bin/torchrun {common.format(n=4, host=1)}" in script
    assert f"  h2) exec /opt/v/bin/torchrun {common.format(n=2, host=0)}" in script
    # .deepspeed_env exported on every node, as DeepSpeed's PDSH runner does
    assert "export OMP_NUM_THREADS=2\nexport NCCL_SOCKET_IFNAME=eth0\n" in script
    assert p.world_size == 6


def test_torchrun_slot_filter_pins_devices_and_moves_the_rendezvous():
    p = plan("torchrun", include="h2:1@h3")
    script = p.files["torchrun_node.sh"][0]
    assert "  h2) export CUDA_VISIBLE_DEVICES=1; exec " in script
    assert "--rdzv-endpoint h2:29500" in script and "h1)" not in script
    assert "  h3) exec " in script  # all of h3's slots: nothing to pin
    assert p.argv[5] == "h2,h3"


def test_torchrun_node_script_quotes_args_exactly(tmp_path):
    odd = ["it's", "$HOME", "a b", "x;y", "50%n", ""]
    p = plan("torchrun", program=["train.py", *odd])
    script = p.files["torchrun_node.sh"][0]
    line = next(ln for ln in script.splitlines() if ln.startswith("  h3)"))
    # run what bash would exec: print the argv instead of exec'ing torchrun
    cmd = line.split(") ", 1)[1].removesuffix(" ;;").replace("exec ", "printf '%s\\n' ", 1)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[-len(odd) - 1 : -1] == odd


# --- mpi ----------------------------------------------------------------------------------


def test_mpi_hostfile_is_openmpis_format():
    assert render_mpi_hostfile({"h1": [0, 1, 2, 3], "h2": [0, 1]}) == "h1 slots=4\nh2 slots=2\n"


def test_mpi_argv_exports_env_and_wraps_ranks():
    p = plan("mpi", exclude="h2", interface="eth0")
    argv = p.argv
    assert argv[:5] == ["mpirun", "--hostfile", "mpi_hostfile", "-np", "5"]
    assert p.files["mpi_hostfile"] == ("h1 slots=4\nh3 slots=1\n", "0644")
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exported == [
        "PATH=/opt/v/bin:/usr/bin", "OMP_NUM_THREADS=2", "NCCL_SOCKET_IFNAME=eth0",
        "MASTER_ADDR=h1", "MASTER_PORT=29500", "DSCLUSTER_LAUNCH_TIME",
    ]  # fmt: skip
    assert argv[argv.index("plm_rsh_agent") - 1 :][:3] == ["--mca", "plm_rsh_agent", "ssh"]
    assert argv[argv.index("--bind-to") :][:2] == ["--bind-to", "none"]
    assert argv[-4:] == ["./mpi_rank.sh", "train.py", "--lr", "0.1"]
    text, mode = p.files["mpi_rank.sh"]
    assert mode == "0755" and 'exec /opt/v/bin/python -u "$@"' in text


def test_mpi_rank_wrapper_maps_openmpis_rank_variables(tmp_path):
    text = plan("mpi").files["mpi_rank.sh"][0].replace("/opt/v/bin/python -u", "env")
    wrapper = tmp_path / "w.sh"
    wrapper.write_text(text)
    env = {
        "PATH": "/usr/bin:/bin",
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    proc = subprocess.run(["sh", str(wrapper)], env=env, capture_output=True, text=True, check=True)
    out = proc.stdout
    got = dict(line.split("=", 1) for line in out.splitlines())
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"]) == (
        "5", "6", "1", "2",
    )  # fmt: skip


def test_mpi_refuses_what_a_hostfile_cannot_express():
    with pytest.raises(DsclusterError, match="cannot pin ranks to slots \\[2\\] on h1"):
        plan("mpi", include="h1:2")
    # CPU slots are not devices: any of them will do
    assert plan("mpi", include="h1:2", accelerators=dict.fromkeys(POOL, "cpu")).world_size == 1


# --- every launcher -----------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpi"])
def test_launch_script_runs_the_argv_from_the_job_dir(launcher):
    p = plan(launcher)
    text, mode = p.files["launch.sh"]
    assert mode == "0755"
    assert text.startswith("#!/bin/bash\n")
    assert "export PATH=/opt/v/bin:" in text and "export PDSH_RCMD_TYPE=ssh" in text
    assert text.rstrip().endswith("exec " + p.command)
    assert shlex.split(p.command.replace('"$DSCLUSTER_LAUNCH_TIME"', "T")) == [
        "T" if a == LAUNCH_TIME else a for a in p.argv
    ]


def test_plan_errors():
    with pytest.raises(DsclusterError, match="launcher 'srun' is unknown"):
        plan("srun")
    with pytest.raises(DsclusterError, match="no script to run"):
        plan("torchrun", program=[])
    with pytest.raises(DsclusterError, match="not a TCP port"):
        plan("mpi", master_port=70000)


def test_cli_parser_takes_the_script_after_double_dash():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_parsers(sub, lambda p: p.add_argument("-i", "--inventory", required=True))
    args = parser.parse_args(
        ["launch", "-i", "inv", "--launcher", "mpi", "--exclude", "h2", "--", "t.py", "--x", "1"]
    )
    assert (args.launcher, args.exclude, args.program) == ("mpi", "h2", ["--", "t.py", "--x", "1"])


def test_lost_nodes_from_torchrun_and_mpirun_logs():
    torchrun_log = [
        "n2: [rank1]: RuntimeError: Connection closed by peer",
        "n2:   exitcode  : 1 (pid: 77)",
        "n1:   exitcode  : 0 (pid: 12)",
    ]
    assert lost_nodes(torchrun_log) == {"n2": "a rank exited with code 1"}
    mpi_log = [
        "mpirun noticed that process rank 2 with PID 0 on node n3 exited on signal 9 (Killed).",
    ]
    assert lost_nodes(mpi_log) == {"n3": "a rank was killed by signal 9"}
    verdict = [
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "  Process name: [[27718,1],4]",
        "  Exit code:    3",
    ]
    rank_hosts = plan("mpi").rank_hosts
    assert rank_hosts == ["h1", "h1", "h1", "h1", "h2", "h2", "h3"]
    assert lost_nodes(verdict, rank_hosts) == {"h2": "rank 4 exited with code 3"}
    assert lost_nodes(["ssh: connect to host n3 port 22: No route to host"]) == {
        "n3": "ssh: connect to host n3 port 22: No route to host"
    }
