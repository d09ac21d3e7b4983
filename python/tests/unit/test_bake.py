"""`dscluster image bake` without a Docker engine: the checks made from the inventory alone
(which node, provisioned or not, the image name), the flat image's run configuration, the
cloud-config of a baked AMI, and the AWS path against a moto EC2 server over real HTTP
(create_image, its tags, then `aws up --ami` with it). The Docker path runs for real in
tests/e2e/test_e2e_bake.py."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import boto3
import pytest
import yaml
from rich.console import Console

from dscluster import bake, paths
from dscluster.degraded import degraded_path
from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.sources.aws import config as aws_config
from dscluster.sources.aws import discover, instance
from dscluster.sources.aws import session as aws_session

from . import aws_moto
from .facts import write_facts

REGION = aws_moto.REGION


def local_inventory(tmp_path: pathlib.Path, hosts=("bk-n1", "bk-n2", "bk-n3"), facts=True):
    """An inventory as `dscluster local up` writes it (its state dir holds the bootstrap
    key), with recorded facts as provision leaves them."""
    state = tmp_path / "state"
    state.mkdir(parents=True)
    (state / "bootstrap_ed25519").write_text("key\n")
    inv = tmp_path / "inventories" / "bk"
    (inv / "facts").mkdir(parents=True)
    data = {
        "all": {
            "vars": {
                "dscluster_cluster_name": "bk",
                "dscluster_state_dir": str(state),
                "dscluster_training_user": "ds",
            },
            "children": {
                "head": {"hosts": {hosts[0]: {"ansible_host": "10.0.0.1"}}},
                "workers": {
                    "hosts": {
                        h: {"ansible_host": f"10.0.0.{i + 2}"} for i, h in enumerate(hosts[1:])
                    }
                },
            },
        }
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    if facts:
        for host in hosts:
            write_facts(inv / "facts", host)
    return inv


def test_bake_picks_the_first_worker_and_names_the_image_after_the_cluster(tmp_path):
    plan = bake.check(load(local_inventory(tmp_path)), node=None, name=None)
    assert (plan.kind, plan.host, plan.name, plan.user) == (
        "docker",
        "bk-n2",
        "dscluster/baked:bk",
        "ds",
    )
    assert plan.versions["torch"] == "2.13.0+cpu" and plan.versions["deepspeed"] == "0.19.8"
    assert plan.labels() == {
        "cluster": "bk",
        "node": "bk-n2",
        "torch": "2.13.0+cpu",
        "deepspeed": "0.19.8",
        "python": "",
        "user": "ds",
    }
    one = bake.check(
        load(local_inventory(tmp_path / "one", hosts=("bk-n1",))), node=None, name=None
    )
    assert one.host == "bk-n1"  # a 1-node cluster: its head
    chosen = bake.check(
        load(
            local_inventory(tmp_path / "n"),
        ),
        node="bk-n1",
        name="me/img:1",
    )
    assert (chosen.host, chosen.name) == ("bk-n1", "me/img:1")


@pytest.mark.parametrize(
    ("node", "name", "prepare", "message"),
    [
        ("bk-n9", None, None, r"--node 'bk-n9' is no host of .*; use one of bk-n1, bk-n2, bk-n3"),
        (None, "Not An Image!", None, r"--name 'Not An Image!' is not a Docker image reference"),
        (
            None,
            None,
            "nofacts",
            r"bk-n2 has no recorded facts .* never provisioned; run "
            r"'dscluster provision -i .*' first",
        ),
        (None, None, "nostack", r"bk-n2's recorded facts name no torch and DeepSpeed"),
        (
            None,
            None,
            "degraded",
            r"bk-n2 is left out as degraded \(sshd died\); bake a node "
            r"that provisioned, e.g. --node bk-n1",
        ),
        (
            None,
            None,
            "static",
            r"bk-n2 of .* is neither a local node container .* nor an EC2 "
            r"instance",
        ),
    ],
)
def test_bake_refuses_from_the_inventory_alone(tmp_path, node, name, prepare, message):
    inv = local_inventory(tmp_path)
    if prepare == "nofacts":
        (inv / "facts" / "bk-n2.json").unlink()
    elif prepare == "nostack":
        write_facts(
            inv / "facts",
            "bk-n2",
            versions={"venv": "/opt/v", "torch_extensions_dir": "/opt/t"},
        )
    elif prepare == "degraded":
        degraded_path(load(inv)).write_text(
            json.dumps({"excluded": {"bk-n2": {"reason": "sshd died", "since": "2026-11-24"}}})
        )
    elif prepare == "static":
        (tmp_path / "state" / "bootstrap_ed25519").unlink()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(DsclusterError, match=message):
        bake.check(load(inv), node=node, name=name)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_cli_image_bake_refuses_before_any_docker_call(tmp_path):
    inv = local_inventory(tmp_path)
    (inv / "facts" / "bk-n2.json").unlink()
    env = {"PATH": "/nonexistent", "DSCLUSTER_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "dscluster", "image", "bake", "-i", str(inv)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    # exit 2: refused from the arguments and the inventory; docker (not on PATH) never ran
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "bk-n2 has no recorded facts" in line and "dscluster provision -i" in line


def test_flat_image_gets_the_node_image_run_configuration_and_labels():
    config = {
        "Env": ["PATH=/usr/bin:/bin", "container=docker", "LANG=C.UTF-8"],
        "Cmd": ["/lib/systemd/systemd"],
        "Entrypoint": None,
        "StopSignal": "SIGRTMIN+3",
        "WorkingDir": "",
    }
    dockerfile = bake._dockerfile("flat:1", config, {"cluster": "bk", "torch": "2.13.0+cpu"})
    assert dockerfile.splitlines() == [
        "FROM flat:1",
        'ENV PATH="/usr/bin:/bin"',
        'ENV container="docker"',
        'ENV LANG="C.UTF-8"',
        'CMD ["/lib/systemd/systemd"]',
        "STOPSIGNAL SIGRTMIN+3",
        'LABEL dscluster.baked.cluster="bk"',
        'LABEL dscluster.baked.torch="2.13.0+cpu"',
    ]


def rooted_clean(root: pathlib.Path, uid: int, gid: int) -> str:
    """clean.sh with its absolute paths under a scratch root (a chroot-free run), the training
    user's account as getent would give it (home under the root), runuser left out (the seed
    runs as this process's user). Nothing may reach this machine's own files: every absolute
    path left in a command is under the scratch root, or /dev/null."""
    script = (paths.docker_dir() / "bake" / "clean.sh").read_text()
    rooted = re.sub(r"(?<=[\s\"'=:-])/(etc|root|var|tmp|opt|home)\b", f"{root}/\\1", script)
    getent = 'account=$(getent passwd "$user" || true)'
    assert getent in rooted
    rooted = rooted.replace(getent, f'account="$user:x:{uid}:{gid}::{root}/home/$user:/bin/sh"')
    sweep = "find / -xdev -user"  # every file of the user's on the disk: here, the root's
    assert sweep in rooted
    rooted = rooted.replace(sweep, f"find {root} -xdev -user")
    assert 'runuser -u "$user" -- ' in rooted
    rooted = rooted.replace('runuser -u "$user" -- ', "")
    for line in rooted.splitlines():
        if line.lstrip().startswith("printf"):
            continue  # the drop-in's text (the path it names on the node), not a command
        code = line.split("#", 1)[0]
        if code.strip() == "/*/*) ;;":
            continue  # a case pattern (an absolute path of two components or more)
        # no command on / itself (but the seed's working directory)
        assert not re.search(r"\s/(\s|$)", code.replace("(cd / &&", "")), line
        for path in re.findall(r"(?<![\w.$}])/[\w.*-][^\s\"';|]*", code):
            assert path.startswith((str(root), "/dev/null", "/bin/sh")), (path, line)
    return rooted


# The training user's uid and gid in the rooted runs: this process's own where it is not root
# (it can chown to them), else an unused pair (root chowns to any).
OWNER = (os.getuid(), os.getgid()) if os.getuid() else (54321, 54321)


def test_clean_script_takes_out_what_makes_a_node_one_node(tmp_path):
    """clean.sh on a copy of a node's files: host keys, machine id, cluster keys, known_hosts,
    munge key, Slurm configuration go; so does what the training user made: its home back to
    /etc/skel (a ~/.ssh that links to root's is removed as a link), authorized_keys2, the job
    secrets, the node-local directories' contents (the directories stay), its files elsewhere;
    the stack stays."""
    root = tmp_path / "root"
    files = {
        "etc/ssh/ssh_host_ed25519_key": "k",
        "etc/ssh/ssh_host_ed25519_key.pub": "k",
        "etc/ssh/ssh_known_hosts": "bk-n1 ssh-ed25519 AAA",
        "etc/machine-id": "0123456789abcdef0123456789abcdef\n",
        "etc/skel/.profile": "skel",
        "root/.ssh/authorized_keys": "ssh-ed25519 AAA bootstrap",
        "root/.ssh/authorized_keys2": "ssh-ed25519 AAA planted",
        "root/.ssh/id_ed25519": "root's key",
        "root/.ssh/keep-me": "root's",
        "home/ds/.ssh-real/id_ed25519": "secret",
        "home/ds/.netrc": "machine x password p",
        "home/ds/.cache/huggingface/token": "hf_x",
        "home/ds/.local/lib/python3.11/site-packages/usercustomize.py": "import os",
        "home/other/.ssh/authorized_keys2": "ssh-ed25519 AAA other",
        "var/lib/dscluster/secrets.env": "export HF_TOKEN=x",
        "var/lib/dscluster/scratch/job/swap": "x",
        "var/spool/cron/crontabs/ds": "* * * * * x",
        "etc/munge/munge.key": "m",
        "etc/slurm/slurm.conf": "ClusterName=bk",
        "opt/dscluster/venv/bin/python": "#!",
        "opt/dscluster/torch_extensions/py311_cpu/op/op.so": "x",
        "opt/dscluster/pycache/evil.cpython-311.pyc": "x",
        "root/.cache/pip/x": "c",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "home/ds/.ssh").symlink_to(root / "root/.ssh")  # ds's ~/.ssh, a link to root's
    (root / "home/ds/.ssh-real").rename(root / "home/ds/.ssh-old")
    uid, gid = OWNER
    for rel in ("var/lib/dscluster/secrets.env", "var/spool/cron/crontabs/ds"):
        os.chown(root / rel, uid, gid)
    rooted = rooted_clean(root, uid, gid)
    proc = subprocess.run(
        ["sh", "-s", "ds", "image", "", "", f"{root}/opt/dscluster/torch_extensions:"
         f"{root}/var/lib/dscluster/scratch:{root}/var/lib/dscluster/checkpoints"],
        input=rooted, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert left == [
        "etc/machine-id",
        "etc/skel/.profile",
        "etc/systemd/system/munge.service.d/dscluster-baked.conf",
        "home/ds/.profile",
        "opt/dscluster/venv/bin/python",
        "root/.ssh/keep-me",
    ], left
    assert (root / "etc/machine-id").read_text() == ""
    # the directories provisioning made stay, emptied; a ~/.ssh that links is gone as a link
    for rel in ("var/lib/dscluster/scratch", "opt/dscluster/torch_extensions", "home/other/.ssh"):
        assert (root / rel).is_dir() and not any((root / rel).iterdir()), rel
    assert sorted(p.name for p in (root / "home/ds").iterdir()) == [".profile"]
    assert (root / "home/ds").stat().st_uid == uid
    # no venv that runs: the prefix stays empty, and the seed says it did not run
    assert not any((root / "opt/dscluster/pycache").iterdir())
    assert bake.seed_said(proc.stdout).startswith("the ranks' bytecode: the seed did not run")


def test_bake_compiles_a_jobs_imports_into_the_ranks_bytecode_in_the_copy(tmp_path):
    """clean.sh's last word on the copy's bytecode prefix: emptied, then ml_stack's seed script
    (as the training user, here this process) with the node's recorded venv and prefix and
    ml_stack's list of what a job imports. Run here on a venv of this Python: the named
    modules' bytecode lands in the prefix, what was planted there is gone, and one that does
    not import is named in bake's line, not fatal."""
    inv = local_inventory(tmp_path)
    root = tmp_path / "root"
    venv, prefix = f"{root}/opt/dscluster/venv", f"{root}/opt/dscluster/pycache"
    for host in ("bk-n1", "bk-n2", "bk-n3"):
        write_facts(
            inv / "facts", host,
            versions={"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "venv": venv,
                      "torch_extensions_dir": "/opt/x", "pycache_dir": prefix},
            scratch_dir="/var/lib/dscluster/scratch", checkpoint_dir="/shared/c",
            job_root="/shared/j",
        )  # fmt: skip
    plan = bake.check(load(inv), node=None, name=None)
    assert (plan.venv, plan.pycache_dir) == (venv, prefix)
    assert plan.node_dirs == ("/opt/x", "/var/lib/dscluster/scratch", "/shared/c", "/shared/j")
    # ml_stack's own list, read from the collection this client drives
    modules = bake.warm_modules()
    assert {"deepspeed.runtime.engine", "deepspeed.launcher.launch", "torch._dynamo"} <= set(
        modules
    )
    args = bake.clean_args(plan)
    assert args == ["ds", "image", prefix, venv, ":".join(plan.node_dirs), *modules]
    assert bake.clean_args(plan, warm=False) == args[:5]
    # what the copy runs, on this machine: a module of the standard library and one absent
    seed = paths.collection_root() / "roles/ml_stack/files/pycache_seed.py"
    (root / "etc").mkdir(parents=True)
    (root / "home/ds").mkdir(parents=True)
    (root / "opt/dscluster/bin").mkdir(parents=True)
    (root / "opt/dscluster/bin/pycache_seed.py").write_bytes(seed.read_bytes())
    (root / "opt/dscluster/venv/bin").mkdir(parents=True)
    (root / "opt/dscluster/venv/bin/python").symlink_to(sys.executable)
    (root / "opt/dscluster/pycache").mkdir(parents=True)
    (root / "opt/dscluster/pycache/evil.cpython-311.pyc").write_text("planted")
    uid, gid = OWNER
    rooted = rooted_clean(root, uid, gid)
    # the node-local directories as clean.sh's defaults name them (under the root here): the
    # recorded ones are this machine's paths
    here = bake.clean_args(plan, ["json.tool", "no_such_module_here"])
    here[4] = ""
    assert all(a.startswith(str(root)) for a in here if a.startswith("/")), here
    proc = subprocess.run(
        ["sh", "-s", *here], input=rooted, capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "cleaned"
    tag = sys.implementation.cache_tag
    json_dir = pathlib.Path(json.__file__).parent
    assert (pathlib.Path(prefix + str(json_dir)) / f"tool.{tag}.pyc").is_file()
    assert not (root / "opt/dscluster/pycache/evil.cpython-311.pyc").exists()
    said = bake.seed_said(proc.stdout)
    assert re.fullmatch(
        r"the ranks' bytecode: [1-9][0-9]* files compiled for a job's imports "
        r"\(not in this stack: no_such_module_here\)",
        said,
    ), said
    assert bake.seed_said('{"seed_failed": true}\ncleaned\n').startswith(
        "the ranks' bytecode: the seed did not run"
    )
    # facts that record no prefix: clean.sh's defaults, no job's imports compiled
    for host in ("bk-n1", "bk-n2", "bk-n3"):
        write_facts(inv / "facts", host)
    bare = bake.clean_args(bake.check(load(inv), node=None, name=None))
    assert bare == ["ds", "image", "", "/opt/dscluster/venv", "/opt/dscluster/torch_extensions"]


# ---------------------------------------------------------------- AWS, on moto


@pytest.fixture
def ec2(aws_env: None) -> Any:
    return boto3.client("ec2", region_name=REGION)


def _ubuntu(ec2: Any) -> str:
    return ec2.describe_images(Filters=[{"Name": "name", "Values": ["ubuntu*"]}])["Images"][0][
        "ImageId"
    ]


def aws_source(ec2: Any, tmp_path: pathlib.Path) -> tuple[Any, Any]:
    """A provisioned 2-node EC2 cluster `src` (moto): its session and inventory."""
    sess = aws_session.session(None, REGION)
    instance.up(sess, "src", instance_type="c5.2xlarge", count=2, ami=_ubuntu(ec2), say=print)
    out = tmp_path / "inventories" / "src"
    discover.write_inventory(sess, "src", out_dir=out, console_keys=False)
    inv = load(out)
    (out / "facts").mkdir(exist_ok=True)
    for host in inv.hosts:
        write_facts(out / "facts", host)
    return sess, inv


BAKED_TAGS = {
    aws_config.BAKED_CLUSTER_TAG: "src",
    "dscluster:baked-torch": "2.13.0+cpu",
    "dscluster:baked-deepspeed": "0.19.8",
    aws_config.BAKED_USER_TAG: "ds",
}
# clean.sh's arguments after `image`: the recorded prefix ('' where none), venv and node-local
# directories; no modules (the builder compiles no job's imports at boot)
CLEAN_THEN_POWER_OFF = re.compile(
    r"echo (\S+) \| base64 -d \| sh -s -- ds image '' /opt/dscluster/venv"
    r" /opt/dscluster/torch_extensions && rm -f /home/\*/\.ssh/authorized_keys"
    r" && sync && systemctl poweroff; exec sleep infinity"
)


def assert_builder_cleans_itself_outside_the_cluster(run: dict[str, Any], node: dict[str, Any]):
    """The builder's RunInstances: clean.sh at boot, then power off."""
    cloud = yaml.safe_load(base64.b64decode(run["UserData"][0]).decode())
    (cmd,) = cloud["bootcmd"]
    assert cmd[:2] == ["sh", "-c"]
    cleaning = CLEAN_THEN_POWER_OFF.fullmatch(cmd[2])
    assert cleaning is not None, cmd[2]
    clean_sh = (paths.docker_dir() / "bake" / "clean.sh").read_bytes()
    assert base64.b64decode(cleaning[1]) == clean_sh
    assert cloud["ssh_genkeytypes"] == []  # cloud-init makes no host key in the builder
    # outside the cluster: no cluster tag, no key pair, no cluster security group; IMDSv2,
    # an encrypted root volume, and a shutdown that stops (not terminates) it
    assert "KeyName" not in run and not any(k.startswith("SecurityGroup") for k in run)
    assert run["SubnetId"] == [node["SubnetId"]]
    assert run["InstanceInitiatedShutdownBehavior"] == ["stop"]
    assert run["MetadataOptions.HttpTokens"] == ["required"]
    assert run["BlockDeviceMapping.1.Ebs.Encrypted"] == ["true"]
    assert aws_config.CLUSTER_TAG not in str(run)


def assert_aws_up_cleans_at_first_boot(ec2: Any, sess: Any, ami: str) -> None:
    """aws up from a baked AMI: each node is told to run clean.sh once, at first boot; from a
    plain AMI, no user data."""
    aws_moto.reset()
    lines: list[str] = []
    instance.up(sess, "next", instance_type="c5.2xlarge", count=2, ami=ami, say=lines.append)
    (run,) = aws_moto.requests("RunInstances")
    assert run["ImageId"] == [ami]
    user_data = base64.b64decode(run["UserData"][0]).decode()
    cloud = yaml.safe_load(user_data)
    (cmd,) = cloud["bootcmd"]
    assert cmd[:4] == ["cloud-init-per", "instance", "dscluster-baked-clean", "sh"]
    encoded = re.search(r"echo (\S+) \| base64 -d \| sh -s -- ds first-boot", cmd[5])
    assert encoded is not None
    assert base64.b64decode(encoded[1]) == (paths.docker_dir() / "bake" / "clean.sh").read_bytes()
    assert any("baked by dscluster" in line for line in lines)

    # a plain AMI: no user data
    aws_moto.reset()
    instance.up(sess, "plain", instance_type="c5.2xlarge", count=1, ami=_ubuntu(ec2), say=print)
    (plain,) = aws_moto.requests("RunInstances")
    assert "UserData" not in plain


def test_aws_bake_makes_a_tagged_ami_that_aws_up_starts_clean(ec2, tmp_path):
    """The AMI is made of a builder that cleaned itself and stopped, never of the live node:
    what ran before the final create_image is the cleaning script, and the uncleaned copy of
    the node (an AMI and its snapshots) and the builder are gone afterwards."""
    sess, inv = aws_source(ec2, tmp_path)
    plan = bake.check(inv, node=None, name="dscluster-src-test")
    worker = inv.hosts[1]
    assert (plan.kind, plan.host, plan.region) == ("aws", worker, REGION)
    assert plan.instance_id == inv.var(worker, "dscluster_instance_id")
    (node,) = ec2.describe_instances(InstanceIds=[plan.instance_id])["Reservations"][0]["Instances"]
    aws_moto.reset()  # the request log: from here on, only what bake sends

    ami = bake.bake_aws(plan, sess, wait_s=30, console=Console())
    # 1. an uncleaned copy of the live node, which is not rebooted
    copy_request, final_request = aws_moto.requests("CreateImage")
    assert copy_request["InstanceId"] == [plan.instance_id]
    assert copy_request["NoReboot"] == ["true"]
    # 2. a builder started from that copy, told to clean itself at boot and power off
    (run,) = aws_moto.requests("RunInstances")
    uncleaned = run["ImageId"][0]
    assert uncleaned != ami
    assert_builder_cleans_itself_outside_the_cluster(run, node)
    # 3. the AMI: of the builder, once it had stopped (the cleaning done), never of the node
    builder = final_request["InstanceId"][0]
    assert builder not in (plan.instance_id, node["InstanceId"])
    assert final_request["_InstanceState"] == ["stopped"]
    assert "NoReboot" not in final_request
    order = [name for name, _ in aws_moto.REQUESTS]
    assert order.index("RunInstances") < len(order) - 1 - order[::-1].index("CreateImage")
    (image,) = ec2.describe_images(ImageIds=[ami])["Images"]
    tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
    assert image["Name"] == "dscluster-src-test" and tags["dscluster:baked-node"] == worker
    assert BAKED_TAGS.items() <= tags.items()
    # 4. the uncleaned copy, its snapshots and the builder are gone; the node runs on
    found = ec2.describe_images(Filters=[{"Name": "image-id", "Values": [uncleaned]}])
    assert found["Images"] == [] and aws_moto.requests("DeleteSnapshot")
    snapshots = ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
    assert [s for s in snapshots if uncleaned in s.get("Description", "")] == []
    assert [s for s in snapshots if ami in s.get("Description", "")]  # the AMI's own: kept
    instances = {
        i["InstanceId"]: i
        for r in ec2.describe_instances(InstanceIds=[builder, plan.instance_id])["Reservations"]
        for i in r["Instances"]
    }
    assert instances[builder]["State"]["Name"] in ("shutting-down", "terminated")
    assert aws_config.tag_value(instances[builder], aws_config.CLUSTER_TAG) is None
    assert instances[plan.instance_id]["State"]["Name"] == "running"

    assert_aws_up_cleans_at_first_boot(ec2, sess, ami)


def test_aws_bake_keeps_nothing_when_the_builder_never_stops(ec2, tmp_path, monkeypatch):
    """A builder whose cleaning fails never powers off: the bake stops in one line, makes no
    AMI, and removes the uncleaned copy, its snapshots and the builder."""
    sess, inv = aws_source(ec2, tmp_path)
    plan = bake.check(inv, node=None, name="dscluster-src-fails")
    monkeypatch.setattr(bake, "builder_user_data", lambda *a: "#cloud-config\nbootcmd: []\n")
    aws_moto.reset()
    with pytest.raises(DsclusterError) as exc:
        bake.bake_aws(plan, sess, wait_s=3, console=Console())
    (run,) = aws_moto.requests("RunInstances")
    builder_line = str(exc.value)
    assert "did not clean itself and stop in time" in builder_line and "\n" not in builder_line
    assert "nothing was baked" in builder_line and "left" not in builder_line
    assert len(aws_moto.requests("CreateImage")) == 1  # the uncleaned copy only
    uncleaned = run["ImageId"][0]
    assert (
        ec2.describe_images(Filters=[{"Name": "image-id", "Values": [uncleaned]}])["Images"] == []
    )
    assert ec2.describe_images(Filters=[{"Name": "name", "Values": [plan.name]}])["Images"] == []
    (req,) = aws_moto.requests("TerminateInstances")
    assert req["InstanceId.1"] != [plan.instance_id]


def test_aws_bake_names_what_it_could_not_remove(ec2, tmp_path):
    sess, inv = aws_source(ec2, tmp_path)
    plan = bake.check(inv, node=None, name="dscluster-src-left")
    aws_moto.reset()
    aws_moto.refuse("DeregisterImage", "UnauthorizedOperation", "not allowed")
    with pytest.raises(DsclusterError) as exc:
        bake.bake_aws(plan, sess, wait_s=30, console=Console())
    (run,) = aws_moto.requests("RunInstances")
    message = str(exc.value)
    assert message.startswith("baked AMI ami-") and "\n" not in message
    assert f"uncleaned AMI {run['ImageId'][0]}" in message and "snapshot snap-" in message
    assert "holds the node's keys" in message and "builder instance" not in message


def test_aws_bake_refuses_a_terminated_node(ec2, tmp_path):
    sess, inv = aws_source(ec2, tmp_path)
    plan = bake.check(inv, node=None, name=None)
    assert re.fullmatch(r"dscluster-src-\d{8}T\d{6}Z", plan.name)
    ec2.terminate_instances(InstanceIds=[plan.instance_id])
    aws_moto.reset()
    with pytest.raises(
        DsclusterError,
        match=rf"instance {plan.instance_id} is (shutting-down|terminated), not running",
    ):
        bake.bake_aws(plan, sess, wait_s=30, console=Console())
    assert aws_moto.requests("CreateImage") == []
