"""torchrun's elastic mode (launch --launcher torchrun --nnodes MIN:MAX --max-restarts N): the
refusals before anything runs, the node script and launch.sh it renders, and launch_watch.py
leaving a lost node to the agents while MIN nodes are left, ending the job otherwise."""

from __future__ import annotations

import shlex
import time

import pytest

from dscluster import runner
from dscluster.cli import flags
from dscluster.errors import DsclusterError
from dscluster.launch import ELASTIC_RESTART_BOUND

from .clirun import one_line_error, run_main
from .test_launch import alive, fake_pdsh, plan, watch

__all__ = ["fake_pdsh"]  # the fixture, which pytest finds by name in this module

THREE = {"h1": 1, "h2": 1, "h3": 2}


def three(launcher="torchrun", **kw):
    hostfile = "".join(f"{h} slots={n}\n" for h, n in THREE.items())
    return plan(launcher, pool=THREE, hostfile_text=hostfile, **kw)


def node_argv(p, host: str) -> list[str]:
    """The torchrun argv the node script execs on `host`."""
    script = p.files["torchrun_node.sh"][0].splitlines()
    line = next(x for x in script if x.startswith(f"  {host})"))
    return shlex.split(line.split(" exec ", 1)[1].removesuffix(" ;;"))


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- what it renders ------------------------------------------------------------------------


def test_elastic_agents_get_min_max_restarts_and_the_store_on_the_master():
    p = three(nnodes=(2, 3), torchrun_max_restarts=2)
    for host in THREE:
        argv = node_argv(p, host)
        assert option(argv, "--nnodes") == "2:3"
        assert option(argv, "--max-restarts") == "2"
        assert option(argv, "--rdzv-backend") == "c10d"
        assert option(argv, "--rdzv-endpoint") == f"h1:{29500}"
        assert option(argv, "--rdzv-id") == "launch-1"  # one rendezvous for every agent
        # the master's agent serves the store: it must not move when another node leaves
        assert option(argv, "--rdzv-conf") == f"is_host={int(host == 'h1')}"
        assert argv[-3:] == ["train.py", "--lr", "0.1"]
    assert option(node_argv(p, "h3"), "--nproc-per-node") == "2"
    # each round's workers get a store of their own (pytorch#135712), on every node
    script = p.files["torchrun_node.sh"][0]
    assert script.count("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; exec ") == 3
    # pdsh starts every node as before; the watcher gets MIN and the bound
    assert p.argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "h1,h2,h3"]
    launch_sh = p.files["launch.sh"][0].splitlines()[-1]
    assert f" --hosts h1,h2,h3 --elastic 2 --elastic-bound {ELASTIC_RESTART_BOUND} -- pdsh " in (
        launch_sh
    )


def test_fixed_nnodes_is_todays_launch_with_agent_restarts():
    fixed = three(nnodes=(3, 3), torchrun_max_restarts=1)
    argv = node_argv(fixed, "h2")
    assert (option(argv, "--nnodes"), option(argv, "--max-restarts")) == ("3", "1")
    assert "--elastic" not in fixed.files["launch.sh"][0]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in fixed.files["torchrun_node.sh"][0]
    plain = three()
    argv = node_argv(plain, "h2")
    assert (option(argv, "--nnodes"), option(argv, "--max-restarts")) == ("3", "0")
    assert "TORCH_DISABLE_SHARE" not in plain.files["torchrun_node.sh"][0]
    # a subset of the nodes: MAX is what is selected
    two = three(nnodes=(1, 2), num_nodes=2)
    assert option(node_argv(two, "h1"), "--nnodes") == "1:2"
    assert " --hosts h1,h2 --elastic 1 " in two.files["launch.sh"][0]


@pytest.mark.parametrize(
    ("nnodes", "kw", "fix"),
    [
        ((2, 4), {}, "give --nnodes 2:3, or select 4 nodes (--num-nodes 4)"),
        ((1, 2), {}, "give --nnodes 1:3, or select 2 nodes (--num-nodes 2)"),
        ((2, 2), {}, "give --nnodes 3, or select 2 nodes (--num-nodes 2)"),
        ((3, 3), {"num_nodes": 2}, "give --nnodes 2, or select 3 nodes (--num-nodes 3)"),
        ((3, 4), {"exclude": "h3"}, "give --nnodes 2:2, or select 4 nodes (--num-nodes 4)"),
    ],
)
def test_nnodes_that_do_not_fit_the_selected_nodes_are_refused(nnodes, kw, fix):
    with pytest.raises(DsclusterError) as exc:
        three(nnodes=nnodes, **kw)
    low, high = nnodes
    given = str(low) if low == high else f"{low}:{high}"
    selected = 3 - (kw.get("exclude") is not None) - (3 - kw.get("num_nodes", 3))
    assert str(exc.value) == (
        f"--nnodes {given} does not fit the {selected} nodes selected: torchrun starts one "
        f"agent on each; {fix}"
    )


# --- refusals on the command line, before anything runs --------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("3:2", "--nnodes 3:2: MIN 3 is above MAX 2; give MIN:MAX with MIN <= MAX, e.g. "
                "--nnodes 2:3"),
        ("0:2", "--nnodes 0:2: a job needs at least 1 node; give MIN from 1, e.g. --nnodes 1:2"),
        ("a:b", "--nnodes 'a:b' is not MIN:MAX or N; give whole node counts, e.g. --nnodes 2:3"),
        ("2:3:4", "--nnodes '2:3:4' is not MIN:MAX or N; give whole node counts, e.g. "
                  "--nnodes 2:3"),
        ("-1:2", "--nnodes '-1:2' is not MIN:MAX or N; give whole node counts, e.g. "
                 "--nnodes 2:3"),
        ("", "--nnodes '' is not MIN:MAX or N; give whole node counts, e.g. --nnodes 2:3"),
    ],
)  # fmt: skip
def test_bad_nnodes_values_are_refused_in_one_line(inventory_dir, monkeypatch, value, says):
    monkeypatch.setattr(runner, "run_playbook", _no_playbook)
    result = run_main(
        "launch", "-i", str(inventory_dir), "--launcher", "torchrun", f"--nnodes={value}",
        "--no-doctor", "--", "/opt/train.py",
    )  # fmt: skip
    line = one_line_error(result, rc=2)
    assert line.startswith(f"dscluster: error: {says}"), line


def test_nnodes_with_another_launcher_is_refused(inventory_dir, monkeypatch):
    monkeypatch.setattr(runner, "run_playbook", _no_playbook)
    for launcher in ("deepspeed", "mpi", "accelerate"):
        result = run_main(
            "launch", "-i", str(inventory_dir), "--launcher", launcher, "--nnodes", "2:3",
            "--no-doctor", "--", "/opt/train.py",
        )  # fmt: skip
        assert one_line_error(result, rc=2) == (
            f"dscluster: error: --nnodes 2:3 is torchrun's elastic mode and --launcher is "
            f"{launcher}; add --launcher torchrun or leave --nnodes out"
        )
    assert not (inventory_dir / "hostfile").exists()


def test_with_nnodes_the_agents_restart_and_the_job_is_not_relaunched(inventory_dir):
    from dscluster import cli  # noqa: PLC0415
    from dscluster.cli import launch as launch_cli  # noqa: PLC0415

    def parsed(*extra: str):
        argv = ["launch", "-i", str(inventory_dir), "--launcher", "torchrun", *extra]
        return cli.build_parser().parse_args([*argv, "--", "/opt/train.py"])

    elastic = parsed("--nnodes", "2:3", "--max-restarts", "2")
    assert flags.torchrun_restarts(elastic) == 2
    assert launch_cli._restart_policy(elastic).max_restarts == 0
    relaunch = parsed("--max-restarts", "2")
    assert flags.torchrun_restarts(relaunch) == 0
    assert launch_cli._restart_policy(relaunch).max_restarts == 2


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--retry-on-error",), "--retry-on-error relaunches the job, and with --nnodes 2:3 "
         "torchrun's agents restart the workers after any failure instead; leave "
         "--retry-on-error out"),
        (("--min-nodes", "2"), "--min-nodes 2 is the relaunch's; with --nnodes the agents go "
         "on while MIN nodes are left: give --nnodes 2:3 instead"),
    ],
)  # fmt: skip
def test_the_relaunchs_own_options_are_refused_with_nnodes(inventory_dir, monkeypatch, extra, says):
    monkeypatch.setattr(runner, "run_playbook", _no_playbook)
    result = run_main(
        "launch", "-i", str(inventory_dir), "--launcher", "torchrun", "--nnodes", "2:3",
        "--max-restarts", "2", *extra, "--no-doctor", "--", "/opt/train.py",
    )  # fmt: skip
    assert one_line_error(result, rc=2) == f"dscluster: error: {says}"


def test_nnodes_above_the_inventory_is_refused_before_anything_is_written(
    inventory_dir, monkeypatch
):
    monkeypatch.setattr(runner, "run_playbook", _no_playbook)
    result = run_main(
        "launch", "-i", str(inventory_dir), "--launcher", "torchrun", "--nnodes", "2:4",
        "--max-restarts", "2", "--no-doctor", "--no-stage", "--", "/opt/train.py",
    )  # fmt: skip
    assert one_line_error(result, rc=1) == (
        "dscluster: error: --nnodes 2:4 does not fit the 3 nodes selected: torchrun starts one "
        "agent on each; give --nnodes 2:3, or select 4 nodes (--num-nodes 4)"
    )
    assert not (inventory_dir / "hostfile").exists()


def test_dry_run_shows_the_elastic_agents(inventory_dir, monkeypatch):
    monkeypatch.setattr(runner, "run_playbook", _no_playbook)
    rc, out, err = run_main(
        "launch", "-i", str(inventory_dir), "--launcher", "torchrun", "--nnodes", "2:3",
        "--max-restarts", "2", "--no-doctor", "--no-stage", "--dry-run", "--",
        "/opt/train.py",
    )  # fmt: skip
    assert rc == 0, err
    agents = [line for line in out.splitlines() if "/bin/torchrun " in line]
    assert len(agents) == 3
    assert all(" --nnodes 2:3 " in a and " --max-restarts 2 " in a for a in agents)


def _no_playbook(*args, **kwargs):
    raise AssertionError("a refused launch ran a playbook")


# --- launch_watch.py --elastic -----------------------------------------------------------------

LOST_H3 = "echo 'pdsh@h1: h3: ssh exited with exit code 255'\n"
# A worker the agents restarted: its round's agents and restart count in its environment,
# outside the launcher's process group as remote workers are.
WORKER = (
    "GROUP_WORLD_SIZE={n} TORCHELASTIC_RESTART_COUNT={r} RANK=0 setsid sleep 300 & "
    "echo $! > w.pid\n"
)
END_ON_2 = "sleep 4; kill $(cat w.pid); "
# The tests that look for the restarted worker start it before pdsh's loss line (the agents
# may restart before ssh notices the lost node): the watcher probes at once on that line, and
# a worker started after it raced the probe (a busy machine lost that race; the next probe
# is 5 s later, after END_ON_2).


def test_elastic_watch_leaves_a_lost_node_to_the_agents_and_passes_their_success(
    tmp_path, fake_pdsh
):
    # The launcher: h3's agent gone (pdsh's 255), the others' workers restarted in a round of
    # 2 agents, the job's end on them, then pdsh's own exit for h3's session.
    proc, started, marker = watch(
        tmp_path,
        WORKER.format(n=2, r=1) + LOST_H3 + END_ON_2 + "echo 'h1: done'\nexit 255\n",
        "--elastic", "2", "--elastic-bound", "30",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert lines[1] == (
        "dscluster: lost node h3 (ssh exited with exit code 255); torchrun's agents go on with "
        "the 2 nodes left (MIN 2): the job ends unless they restart the workers within 30 s"
    )
    assert "dscluster: torchrun's agents run the workers without h3: 2 nodes, restart 1" in lines
    assert "h1: done" in lines and "ending the launcher" not in out
    assert lines[-1] == (
        "dscluster: torchrun's agents finished the job on 2 nodes, without h3 (lost); "
        "pdsh's exit 255 was theirs"
    )
    probe = fake_pdsh.read_text().splitlines()[0]
    assert " -w h1,h2 " in probe and "GROUP_WORLD_SIZE" in probe and marker in probe
    assert time.monotonic() - started < 30


def test_elastic_watch_ends_the_job_when_the_agents_do_not_restart(tmp_path, fake_pdsh):
    # A worker of the round before the loss (3 agents) is all that runs: no restart came.
    proc, started, _ = watch(
        tmp_path,
        LOST_H3 + WORKER.format(n=3, r=0) + "sleep 300 & echo $! > hang.pid; wait\n",
        "--elastic", "2", "--elastic-bound", "2",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert (
        "dscluster: ending the launcher: torchrun's agents did not restart the workers within "
        "2 s of losing h3" in out
    )
    assert "run the workers without" not in out
    assert time.monotonic() - started < 20
    # ended as a lost node: the launcher's group and the stale worker on the nodes left
    assert not alive(int((tmp_path / "hang.pid").read_text()))
    assert not alive(int((tmp_path / "w.pid").read_text()))
    assert " -w h1,h2 " in fake_pdsh.read_text().splitlines()[-1]


@pytest.mark.parametrize(
    ("elastic", "line", "said"),
    [
        # fewer than MIN left: as without --elastic, after saying so
        ("3", LOST_H3, "dscluster: 2 nodes left, fewer than --nnodes MIN 3"),
        # an agent that failed by itself (its restarts used up) is no node to go on without
        ("2", "echo 'pdsh@h1: h2: ssh exited with exit code 1'\n", ""),
        # nor is the master, whose agent serves the rendezvous store
        (
            "2",
            "echo 'pdsh@h1: h1: ssh exited with exit code 255'\n",
            "dscluster: h1 served torchrun's rendezvous: the agents cannot go on without it",
        ),
    ],
)
def test_elastic_watch_ends_the_job_as_before_otherwise(tmp_path, fake_pdsh, elastic, line, said):
    proc, started, _ = watch(
        tmp_path, line + "sleep 300 & echo $! > hang.pid; wait\n", "--elastic", elastic
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert time.monotonic() - started < 15
    assert "dscluster: ending the launcher 1 s after " in out
    assert "torchrun's agents go on" not in out
    if said:
        assert said in out.splitlines()
    assert not alive(int((tmp_path / "hang.pid").read_text()))


def test_elastic_watch_keeps_a_failure_of_the_nodes_left(tmp_path, fake_pdsh):
    # h3 lost and left behind, but h2's agent then failed too: pdsh's status stands.
    proc, _, _ = watch(
        tmp_path,
        WORKER.format(n=2, r=1) + LOST_H3
        + END_ON_2 + "echo 'pdsh@h1: h2: ssh exited with exit code 1'\nexit 255\n",
        "--elastic", "2",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 255, out
    assert "run the workers without h3" in out
    assert "finished the job" not in out


def test_elastic_probe_reads_the_workers_round(tmp_path):
    from dscluster.jobs.launch_watch import restarted_without  # noqa: PLC0415

    lines = ["h1: dscluster-elastic 3 0", "h2: dscluster-elastic 2 1", "h2: dscluster-elastic 2 2"]
    assert restarted_without(lines, 2) == (2, 2)
    assert restarted_without(lines[:1], 2) is None
    assert restarted_without(["h1: dscluster-elastic 2 x"], 2) is None


def test_exclude_unhealthy_starts_the_elastic_job_on_the_nodes_left():
    from dscluster.launch import LaunchRequest  # noqa: PLC0415
    from dscluster.launch.exclude import request_without  # noqa: PLC0415

    pool, left_out = {"h1": 1, "h2": 1}, {"h3": "shm"}
    elastic = LaunchRequest("torchrun", program=["t.py"], nnodes=(2, 3))
    assert request_without(elastic, pool, left_out).nnodes == (2, 2)
    for nnodes, given in (((3, 3), "3"), ((3, 4), "3:4")):
        fixed = LaunchRequest("torchrun", program=["t.py"], nnodes=nnodes)
        with pytest.raises(DsclusterError) as exc:
            request_without(fixed, pool, left_out)
        assert str(exc.value) == (
            f"--nnodes {given} needs 3 nodes and 2 are left once doctor leaves out h3 (shm); "
            "lower MIN or fix them"
        )


def test_elastic_watch_names_an_ssh_error_without_its_carriage_return(tmp_path, fake_pdsh):
    # ssh ends its own errors in \r\n: the watcher's line about it stays one line
    proc, _, _ = watch(
        tmp_path,
        "printf 'h3: ssh: connect to host h3 port 22: Connection timed out\\r\\n'\n"
        "sleep 300 & echo $! > hang.pid; wait\n",
        "--elastic", "2", "--elastic-bound", "1",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert (
        "dscluster: lost node h3 (ssh: connect to host h3 port 22: Connection timed out); "
        "torchrun's agents go on with the 2 nodes left (MIN 2)" in out
    )
    assert not alive(int((tmp_path / "hang.pid").read_text()))
