"""Users' own training stacks end to end on the shared e2e cluster: their requirements added
as the wheelhouse's user layer (no DeepSpeed build, torch untouched), then the example
projects of examples/ shipped with `launch --workdir` under the launchers of the seed
guides: the HF Trainer with a seed-002 "auto" DeepSpeed ZeRO-2 config under the deepspeed
launcher, an Accelerate loop under `--launcher accelerate`, a Lightning DDP script under
torchrun. Each job must run on every slot, every rank must report the world size its own
framework sees, and the loss must fall. Needs a Docker engine and a provisioned cluster.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from .. import rolefiles
from .e2e_cluster import NAME, NODES, dsc

pytestmark = pytest.mark.docker

HOSTS = [f"{NAME}-n{i}" for i in range(1, NODES + 1)]
EXAMPLES = rolefiles.REPO / "examples"
PORT = "29519"


def slots(cluster: pathlib.Path) -> dict[str, int]:
    """host -> slots, from the inventory's hostfile (`host slots=N`)."""
    pairs = [line.split() for line in (cluster / "hostfile").read_text().splitlines() if line]
    return {host: int(spec.split("=")[1]) for host, spec in pairs}


def results(stdout: str) -> list[dict]:
    return [json.loads(m[1]) for m in re.finditer(r"RESULT (\{.*\})", stdout)]


def launch(cluster: pathlib.Path, *args: str, timeout: int = 900):
    return dsc(
        "launch", "-i", str(cluster), "--no-doctor", "--master-port", PORT,
        "--timeout", str(timeout - 60), *args, timeout=timeout,
    )  # fmt: skip


def assert_every_slot_trained(proc, cluster: pathlib.Path, framework: str) -> list[dict]:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    world = sum(slots(cluster).values())
    ranks = results(proc.stdout)
    assert sorted(r["rank"] for r in ranks) == list(range(world)), proc.stdout[-3000:]
    assert {r["framework"] for r in ranks} == {framework}
    # The world size the framework itself counts, not only the launcher's.
    assert {r["world_size"] for r in ranks} == {world}, ranks
    assert {r["host"] for r in ranks} == set(HOSTS)
    assert all(r["last_loss"] < r["first_loss"] for r in ranks), ranks
    # Where it ran and where the log is.
    assert re.search(r"ran in \S+/jobs/launch-\S+ on " + re.escape(HOSTS[0]), proc.stderr)
    return ranks


def test_user_requirements_are_a_layer_beside_torch_and_deepspeed(user_stack):
    proc, before, after = user_stack
    out = proc.stdout
    assert "Build the DeepSpeed wheel" not in out  # the base layer was reused as it was
    for host in HOSTS:
        assert after[host]["torch"] == before[host]["torch"], host  # not reinstalled
        assert after[host]["deepspeed"] == before[host]["deepspeed"], host
        assert after[host]["transformers"].startswith("5.23.0 "), after[host]
        assert after[host]["accelerate"].startswith("1.15.0 "), after[host]
        assert after[host]["lightning"].startswith("2.6.6 "), after[host]


def test_hf_trainer_deepspeed_zero2_with_auto_config(cluster: pathlib.Path, user_stack):
    proc = launch(
        cluster, "--workdir", str(EXAMPLES / "hf_trainer"), "--",
        "train.py", "--deepspeed", "ds_config.json",
    )  # fmt: skip
    ranks = assert_every_slot_trained(proc, cluster, "transformers.Trainer")
    assert all(r["deepspeed"] is True and r["zero_stage"] == 2 for r in ranks), ranks


def test_accelerate_ddp_with_the_generated_config(cluster: pathlib.Path, user_stack):
    proc = launch(
        cluster, "--launcher", "accelerate", "--workdir", str(EXAMPLES / "accelerate"), "--",
        "train.py",
    )  # fmt: skip
    ranks = assert_every_slot_trained(proc, cluster, "accelerate")
    assert {r["distributed_type"] for r in ranks} == {"MULTI_CPU"}  # the CPU cluster's DDP


def test_accelerate_fsdp_refused_on_cpu_nodes_before_anything_runs(cluster: pathlib.Path):
    """Accelerate turns FSDP on only for GPU-like devices: on these CPU nodes an FSDP config
    would train plain DDP without a word, so the generated one is refused up front."""
    proc = launch(
        cluster, "--launcher", "accelerate", "--accelerate-config-kind", "fsdp",
        "--workdir", str(EXAMPLES / "accelerate"), "--", "train.py", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--accelerate-config-kind fsdp" in lines[0], lines
    assert "--accelerate-config-kind ddp" in lines[0]
    assert "Stage the job" not in proc.stdout + proc.stderr  # no playbook ran


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_lightning_ddp(cluster: pathlib.Path, user_stack, launcher: str):
    """torchrun gives Lightning its environment; under the deepspeed launcher ds_rank.sh adds
    the NODE_RANK/GROUP_RANK it reads (without them every rank was global rank 0, a hang)."""
    per_node = set(slots(cluster).values())
    assert len(per_node) == 1
    proc = launch(
        cluster, "--launcher", launcher, "--workdir", str(EXAMPLES / "lightning"), "--",
        "train.py", "--devices", str(per_node.pop()), "--nodes", str(NODES),
        "--accelerator", "cpu",
    )  # fmt: skip
    ranks = assert_every_slot_trained(proc, cluster, "lightning")
    assert sorted(r["node_rank"] for r in ranks) == list(range(NODES))


def test_script_error_is_a_failed_job_not_a_lost_node(
    cluster: pathlib.Path, tmp_path: pathlib.Path, user_stack
):
    """The issue's case: a project whose config the script reads by a relative path, shipped
    with --workdir (it was not, and every rank failed), then a script that raises on every
    rank: the job failed on those ranks, every node reachable, with the error shown."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "conf.json").write_text('{"fail": true}')
    (project / ".gitignore").write_text("big.bin\n")
    (project / "big.bin").write_bytes(b"x" * 1024)
    (project / "train.py").write_text(
        "import json, os, sys\n"
        "conf = json.load(open(sys.argv[1]))  # relative: the job runs in the project\n"
        "assert not os.path.exists('big.bin'), 'ignored file shipped'\n"
        "if conf['fail']:\n"
        "    raise ValueError('bad learning rate in ' + sys.argv[1])\n"
    )
    proc = launch(cluster, "--launcher", "torchrun", "--workdir", str(project), "--",
                  "train.py", "conf.json", timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    world = sum(slots(cluster).values())
    ranks = ",".join(str(r) for r in range(world))
    assert f"job failed on ranks {ranks} (" in line and "every node reachable" in line, line
    assert "ValueError: bad learning rate in conf.json" in line, line
    assert "lost node" not in line
