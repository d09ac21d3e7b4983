"""`dscluster image bake`: a provisioned node made into an image of the whole stack.

Before anything is made, a local node's stack is checked against the controller's wheelhouse
(stack_manifest.py, docker/bake/verify_stack.py, run on the node by its system python): its
wheelhouse holds exactly the lock's wheels, and every file of the venv's site-packages is one
a locked wheel's RECORD lists, with its hash; any other file or hash is refused in one line.
An AMI's bake does not check this (its builder's user data holds 16 KB, no file list).

A local cluster's node becomes a Docker image: the node container is committed, the copy is
cleaned (docker/bake/clean.sh: SSH host keys, machine id, cluster keys, known_hosts, munge
key, Slurm configuration, caches and logs, and whatever the training user and its jobs made:
its home back to /etc/skel, the job secrets, the node-local directories' contents, every
file it owns, the ranks' bytecode made again from the venv) in a throw-away container, and
that container's filesystem is imported as one flat layer, so nothing removed survives in a
lower layer. The node itself is not touched. `dscluster local up --image TAG` starts nodes
from it; each makes its own host keys and machine id at first boot and `dscluster provision`
gives it the cluster's keys and files, while its stack is already installed (ml_stack finds
it complete).

An AWS cluster's node becomes an AMI the same way: `create_image` of the node (no reboot) is
an uncleaned copy, a builder instance started from it runs clean.sh at boot and powers off,
and the AMI, tagged with the cluster, the node and the stack's versions, is made of that
stopped builder; the copy and the builder are removed. `dscluster aws up --ami <id>` starts
nodes from it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shlex
import subprocess
import time
from typing import Any

import yaml
from rich.console import Console

from . import stack_manifest, storage
from .errors import DsclusterError
from .inventory import Inventory
from .sources.names import check_cluster_name
from .validate import IMAGE_REF_RE

# What the baked image or AMI is tagged with (Docker labels, EC2 tags).
LABEL_PREFIX = "dscluster.baked"
TAG_PREFIX = "dscluster:baked"  # sources.aws.config.BAKED_CLUSTER_TAG is its "-cluster"
# An AMI name: 3 to 128 of these (EC2's rule).
AMI_NAME_RE = re.compile(r"[A-Za-z0-9()\[\] ./'@_-]{3,128}")


@dataclasses.dataclass(frozen=True)
class Bake:
    """What `image bake` was asked for, checked against the inventory."""

    kind: str  # "docker" or "aws"
    cluster: str
    host: str
    name: str  # the image tag (docker) or the AMI name (aws)
    user: str  # the training user (its ~/.ssh holds the cluster key)
    versions: dict[str, str]
    instance_id: str = ""
    region: str = ""
    # The node's venv and the ranks' bytecode prefix (ml_stack_pycache_dir), as recorded; ""
    # where its facts name none (then clean.sh's defaults, and no job's imports compiled).
    venv: str = ""
    pycache_dir: str = ""
    # The node-local directories the training user writes (torch extensions, scratch, the job
    # area and checkpoints), as recorded: clean.sh empties those on the copy's own disk.
    node_dirs: tuple[str, ...] = ()
    # What the stack is checked against before the bake (stack_manifest.py): the inventory
    # (named in the fix), the node's wheelhouse (required where it is on the node's own disk),
    # the controller's cache of wheelhouses.
    inventory: str = ""
    wheelhouse: str = ""
    wheelhouse_required: bool = True
    cache_dir: str = ""

    def labels(self) -> dict[str, str]:
        return {
            "cluster": self.cluster,
            "node": self.host,
            "torch": self.versions.get("torch", ""),
            "deepspeed": self.versions.get("deepspeed", ""),
            "python": self.versions.get("python", ""),
            "user": self.user,
        }


def default_name(kind: str, cluster: str) -> str:
    if kind == "docker":
        return f"dscluster/baked:{cluster}"
    return f"dscluster-{cluster}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def pick_host(inv: Inventory, node: str | None) -> str:
    """--node, else the first worker (a node like every other), else the head."""
    hosts = inv.hosts
    if node is not None:
        if node not in hosts:
            raise DsclusterError(
                f"--node {node!r} is no host of {inv.source}; use one of {', '.join(hosts)}"
            )
        return node
    workers = [h for h in hosts if h != inv.head]
    return workers[0] if workers else inv.head


def _kind(inv: Inventory, host: str) -> str:
    if inv.var(host, "dscluster_instance_id"):
        return "aws"
    state = inv.var(host, "dscluster_state_dir")
    if state and (pathlib.Path(str(state)) / "bootstrap_ed25519").is_file():
        return "docker"
    raise DsclusterError(
        f"{host} of {inv.source} is neither a local node container (made by 'dscluster local "
        "up') nor an EC2 instance (no dscluster_instance_id): image bake makes Docker images "
        "of local clusters and AMIs of AWS clusters; bake other machines with your own "
        "imaging tool after 'dscluster provision'"
    )


def check(inv: Inventory, *, node: str | None, name: str | None) -> Bake:
    """Every refusal that needs no Docker or AWS call: the host, that it is provisioned and
    not left out as degraded, the image name."""
    from .degraded import read_degraded  # noqa: PLC0415
    from .node_facts import read_facts_file  # noqa: PLC0415

    host = pick_host(inv, node)
    kind = _kind(inv, host)
    cluster = str(inv.var(host, "dscluster_cluster_name") or inv.directory.name)
    check_cluster_name(cluster)
    degraded = read_degraded(inv)
    if host in degraded:
        raise DsclusterError(
            f"{host} is left out as degraded ({degraded[host].get('reason', '')}); bake a "
            "node that provisioned, e.g. --node "
            + next((h for h in inv.hosts if h not in degraded), inv.head)
        )
    facts = inv.directory / "facts" / f"{host}.json"
    if not facts.is_file():
        raise DsclusterError(
            f"{host} has no recorded facts ({facts}): it was never provisioned; run "
            f"'dscluster provision -i {inv.source}' first, then bake"
        )
    recorded = read_facts_file(facts, host)
    node_dirs = _node_dirs(facts, recorded.torch_extensions_dir)
    versions = {k: str(v) for k, v in recorded.versions.items() if isinstance(v, str)}
    if not versions.get("torch") or not versions.get("deepspeed"):
        raise DsclusterError(
            f"{host}'s recorded facts name no torch and DeepSpeed ({facts}); run "
            f"'dscluster provision -i {inv.source}' to completion first, then bake"
        )
    if name is None:
        name = default_name(kind, cluster)
    elif kind == "docker" and not IMAGE_REF_RE.fullmatch(name):
        raise DsclusterError(
            f"--name {name!r} is not a Docker image reference; give name[:tag], e.g. "
            f"--name dscluster/baked:{cluster}"
        )
    elif kind == "aws" and not AMI_NAME_RE.fullmatch(name):
        raise DsclusterError(
            f"--name {name!r} is not an AMI name (3 to 128 letters, digits, spaces and "
            f"()[]./'@_-); e.g. --name dscluster-{cluster}"
        )
    where = storage.inventory_paths(inv)  # cluster-wide (validate_inventory)
    cache = inv.var(host, "dscluster_cache_dir")
    return Bake(
        kind=kind,
        cluster=cluster,
        host=host,
        name=name,
        user=str(inv.var(host, "dscluster_training_user") or "ds"),
        versions=versions,
        instance_id=str(inv.var(host, "dscluster_instance_id") or ""),
        region=str(inv.var(host, "dscluster_aws_region") or ""),
        venv=recorded.venv,
        pycache_dir=recorded.pycache_dir,
        node_dirs=node_dirs,
        inventory=str(inv.source),
        wheelhouse=where.wheelhouse_dir,
        wheelhouse_required=where.kind == "none",
        cache_dir=cache if isinstance(cache, str) and "{{" not in cache else "",
    )


def _node_dirs(facts: pathlib.Path, torch_extensions_dir: str) -> tuple[str, ...]:
    """The directories the training user writes on the node, as its facts record them (the
    launcher's job_root, checkpoint_dir, scratch_dir). Shared ones too: clean.sh empties a
    directory only on the copy's own disk (a node's copy has no shared mount; the NFS
    server's export is its disk, and what jobs left there is theirs, not the image's)."""
    try:
        data = json.loads(facts.read_text())
    except (OSError, ValueError):
        data = {}
    found: list[object] = [torch_extensions_dir]
    if isinstance(data, dict):
        found += [data.get(k) for k in ("scratch_dir", "checkpoint_dir", "job_root")]
    # absolute paths clean.sh can take in one ':'-separated argument
    return tuple(
        dict.fromkeys(p for p in found if isinstance(p, str) and p.startswith("/") and ":" not in p)
    )


# -- Docker -----------------------------------------------------------------------------


def _dockerfile(base: str, config: dict[str, Any], labels: dict[str, str]) -> str:
    """The Dockerfile that gives the flat image (`docker import` keeps no configuration) the
    node image's run configuration and the bake's labels; it adds no filesystem layer."""
    lines = [f"FROM {base}"]
    for env in config.get("Env") or []:
        key, _, value = env.partition("=")
        lines.append(f"ENV {key}={json.dumps(value)}")
    if config.get("Entrypoint"):
        lines.append(f"ENTRYPOINT {json.dumps(config['Entrypoint'])}")
    if config.get("Cmd"):
        lines.append(f"CMD {json.dumps(config['Cmd'])}")
    if config.get("StopSignal"):
        lines.append(f"STOPSIGNAL {config['StopSignal']}")
    if config.get("WorkingDir"):
        lines.append(f"WORKDIR {config['WorkingDir']}")
    for key, value in sorted(labels.items()):
        lines.append(f"LABEL {LABEL_PREFIX}.{key}={json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _ml_stack_vars() -> dict[str, Any]:
    from . import paths  # noqa: PLC0415

    data = yaml.safe_load((paths.collection_root() / "roles/ml_stack/vars/main.yml").read_text())
    return data if isinstance(data, dict) else {}


def warm_modules() -> list[str]:
    """What a training job imports beyond what the install compiled: ml_stack's list
    (roles/ml_stack/vars/main.yml, __ml_stack_warm_modules), the one its seed step uses."""
    # a collection without the list (older): the seed still copies the venv's bytecode
    return [str(m) for m in _ml_stack_vars().get("__ml_stack_warm_modules") or []]


def stack_manifest_of(plan: Bake) -> dict[str, Any]:
    """What the node's stack is checked against: the controller's wheelhouse (and user layer)
    its venv was installed from, and Debian's wheels (ml_stack's __ml_stack_system_wheels),
    where the venv's pip comes from."""
    from . import paths  # noqa: PLC0415

    cache = pathlib.Path(plan.cache_dir) if plan.cache_dir else paths.cache_root()
    base, user = stack_manifest.controller_layers(cache, plan.host, plan.versions)
    return stack_manifest.build(
        host=plan.host,
        venv=plan.venv or "/opt/dscluster/venv",
        node_wheelhouse=plan.wheelhouse,
        wheelhouse_required=plan.wheelhouse_required,
        base=base,
        user=user,
        system_wheels=str(_ml_stack_vars().get("__ml_stack_system_wheels") or ""),
    )


def verify_stack(plan: Bake, container: str, console: Console) -> None:
    """The node's wheelhouse and venv, checked as root on the node by its system python
    against the controller's wheelhouse (docker/bake/verify_stack.py); any difference is
    refused in one line, before anything is made."""
    from . import paths  # noqa: PLC0415

    started = time.monotonic()
    manifest = stack_manifest_of(plan)
    script = (paths.docker_dir() / "bake" / "verify_stack.py").read_bytes()
    proc = subprocess.run(
        ["docker", "exec", "-i", "-u", "root", container, "sh", "-c",
         stack_manifest.NODE_COMMAND],
        input=stack_manifest.payload(script, manifest),
        capture_output=True,
        timeout=1800,
        check=False,
    )  # fmt: skip
    found = stack_manifest.verdict(proc.stdout.decode(errors="replace"))
    if found is None:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise DsclusterError(
            f"could not check {plan.host}'s stack (exit {proc.returncode}: {last}); nothing "
            "was baked; it needs /usr/bin/python3 and tar on the node"
        )
    if not found.get("ok"):
        fix = stack_manifest.fix_for(
            found, host=plan.host, venv=manifest["venv"], wheelhouse=plan.wheelhouse,
            source=plan.inventory,
        )  # fmt: skip
        raise DsclusterError(stack_manifest.refusal(plan.host, found, fix))
    system = found.get("system") or []
    console.print(
        f"{plan.host}'s stack is the controller's: {found.get('wheels', 0)} wheelhouse files, "
        f"{found.get('files', 0)} venv files by hash"
        + (f" (from Debian's wheels, dpkg-checked: {', '.join(system)})" if system else "")
        + f", {found.get('bytecode', 0)} bytecode files not hashed; "
        f"{time.monotonic() - started:.1f} s",
        markup=False,
        highlight=False,
    )


def clean_args(plan: Bake, modules: list[str] | None = None, *, warm: bool = True) -> list[str]:
    """clean.sh's arguments for the copy: the training user, `image`, the recorded bytecode
    prefix and venv ("": clean.sh's defaults), the node-local directories (":"-joined), then
    (warm, and the facts record both) what a job imports, which the prefix's seed compiles as
    the training user once the home is emptied. ml_stack compiles those at install only
    where a node runs several ranks; elsewhere the first job on each node compiles them
    (about 1500 modules, 5 s of a core per rank). Done once here, every node started from the
    image runs its first job from bytecode. Best effort: a module that does not import is
    named in the seed's JSON line, and a failure leaves the bake going."""
    args = [plan.user, "image", plan.pycache_dir, plan.venv, ":".join(plan.node_dirs)]
    if warm and plan.venv and plan.pycache_dir:
        args += modules if modules is not None else warm_modules()
    return args


def seed_said(stdout: str) -> str:
    """One line from the seed's JSON verdict in the copy's output ("" when it said none)."""
    for line in reversed(stdout.splitlines()):
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if not isinstance(verdict, dict):
            continue
        if verdict.get("seed_failed"):
            return (
                "the ranks' bytecode: the seed did not run; the first job on each node compiles it"
            )
        if "compiled" in verdict:
            said = f"the ranks' bytecode: {verdict['compiled']} files compiled for a job's imports"
            missing = sorted(verdict.get("not_imported") or {})
            return said + (f" (not in this stack: {', '.join(missing)})" if missing else "")
    return ""


def bake_docker(plan: Bake, console: Console) -> str:
    """Commit the node, clean a copy, import it flat as plan.name; the image id."""
    from . import paths  # noqa: PLC0415
    from .sources.local import LABEL, docker, ensure_engine  # noqa: PLC0415
    from .util import run  # noqa: PLC0415

    ensure_engine()
    container = f"dsc-{plan.host}"
    found = run(
        ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{LABEL}"}}}}', container],
        check=False,
    )
    if found.returncode != 0 or found.stdout.strip() != plan.cluster:
        raise DsclusterError(
            f"no container {container} of local cluster {plan.cluster}; start it with "
            f"'dscluster local up --name {plan.cluster}' and provision it, then bake"
        )
    verify_stack(plan, container, console)
    script = (paths.docker_dir() / "bake" / "clean.sh").read_text()
    scratch_tag = f"dscluster/bake-scratch:{plan.cluster}"
    flat_tag = f"dscluster/bake-flat:{plan.cluster}"
    scratch = f"dsc-bake-{plan.cluster}"
    started = time.monotonic()
    run(["docker", "rm", "-f", scratch], check=False)  # one an interrupted bake left
    try:
        console.print(f"committing {container} (paused for the commit)")
        docker("commit", "--pause=true", container, scratch_tag, timeout=1800)
        args = clean_args(plan)
        console.print(
            "cleaning a copy: host keys, machine id, cluster keys, munge key, caches, the "
            "training user's files; the ranks' bytecode made again from the venv"
            + ("; a job's imports compiled into it" if len(args) > 5 else "")
        )
        cleaned = run(
            ["docker", "run", "-i", "--name", scratch, "--entrypoint", "/bin/sh",
             scratch_tag, "-s", *args],
            input=script,
            timeout=900,
        )  # fmt: skip
        if said := seed_said(cleaned.stdout):
            console.print(said)
        config = json.loads(docker("image", "inspect", scratch_tag))[0]["Config"]
        labels = plan.labels() | {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        console.print(f"importing the cleaned copy as one layer: {plan.name}")
        with subprocess.Popen(["docker", "export", scratch], stdout=subprocess.PIPE) as export:
            imported = subprocess.run(
                ["docker", "import", "-", flat_tag],
                stdin=export.stdout,
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            if export.stdout is not None:
                export.stdout.close()
            export.wait(timeout=60)
        if imported.returncode != 0 or export.returncode != 0:
            last = (imported.stderr.strip().splitlines() or [f"exit {export.returncode}"])[-1]
            raise DsclusterError(f"docker export | docker import of {scratch} failed: {last}")
        # The run configuration and labels: metadata only, no second filesystem layer.
        run(
            ["docker", "build", "-q", "-t", plan.name, "-"],
            input=_dockerfile(flat_tag, config, labels),
            timeout=600,
        )
    finally:
        run(["docker", "rm", "-f", scratch], check=False)
        run(["docker", "image", "rm", "-f", scratch_tag, flat_tag], check=False)
    image_id = docker("image", "inspect", "-f", "{{.Id}}", plan.name)
    console.print(f"baked {plan.name} in {time.monotonic() - started:.0f} s")
    return image_id


# -- AWS --------------------------------------------------------------------------------

# Tag on what a bake makes only for a while (the uncleaned copy, the builder): the cluster it
# copies. Never dscluster:cluster, so the builder is no node of the cluster.
TEMP_TAG = "dscluster:bake-temporary"


def builder_user_data(user: str, extra: list[str] | tuple[str, ...] = ()) -> str:
    """cloud-config for the builder, an instance started from an uncleaned copy of the node:
    docker/bake/clean.sh (`user image`, then `extra`: clean_args' prefix, venv and node-local
    directories) and every user's authorized_keys in cloud-init's bootcmd, which
    runs before sshd starts and before cloud-init's ssh module makes host keys; then it
    powers off. A failed cleaning never powers off (the bake times out and keeps nothing),
    and the sleep keeps boot, sshd included, from going on past this step."""
    import base64  # noqa: PLC0415

    from . import paths  # noqa: PLC0415

    script = (paths.docker_dir() / "bake" / "clean.sh").read_bytes()
    encoded = base64.b64encode(script).decode()
    command = (
        f"echo {encoded} | base64 -d | sh -s -- "
        + " ".join(shlex.quote(a) for a in [user, "image", *extra])
        + " && rm -f /home/*/.ssh/authorized_keys && sync && systemctl poweroff;"
        " exec sleep infinity"
    )
    return (
        "#cloud-config\n"
        "# dscluster image bake: a copy of a cluster node; clean it, then power off.\n"
        "ssh_deletekeys: true\n"
        "ssh_genkeytypes: []\n"
        "bootcmd:\n"
        f"  - [sh, -c, {json.dumps(command)}]\n"
    )


@dataclasses.dataclass
class _Scratch:
    """What a bake made for a while: the uncleaned copy (and its snapshots), the builder."""

    image: str = ""
    snapshots: list[str] = dataclasses.field(default_factory=list)
    builder: str = ""

    def items(self) -> list[str]:
        found = [f"builder instance {self.builder}"] if self.builder else []
        if self.image:
            found.append(f"uncleaned AMI {self.image}")
        found += [f"snapshot {s}" for s in self.snapshots]
        return found


def _wait(ec2: Any, waiter: str, deadline: float, **ids: Any) -> None:
    left = max(1, int(deadline - time.monotonic()))
    delay = 15 if left > 60 else 1
    ec2.get_waiter(waiter).wait(
        **ids, WaiterConfig={"Delay": delay, "MaxAttempts": max(1, left // delay)}
    )


def _node_instance(ec2: Any, plan: Bake) -> dict[str, Any]:
    found = ec2.describe_instances(InstanceIds=[plan.instance_id])
    instances = [i for r in found.get("Reservations", []) for i in r["Instances"]]
    states = [i["State"]["Name"] for i in instances]
    if states not in (["running"], ["stopped"]):
        raise DsclusterError(
            f"{plan.host}'s instance {plan.instance_id} is "
            f"{states[0] if states else 'gone'}, not running; bake a running node "
            "(--node) or start it"
        )
    return dict(instances[0])


def _remove_scratch(ec2: Any, made: _Scratch) -> list[str]:
    """Terminate the builder, deregister the uncleaned copy, delete its snapshots; what is
    left (each step tried even when one before failed)."""
    left: list[str] = []
    steps: list[tuple[str, Any]] = []
    if made.builder:
        steps.append(
            (f"builder instance {made.builder}",
             lambda: ec2.terminate_instances(InstanceIds=[made.builder]))
        )  # fmt: skip
    if made.image:
        steps.append(
            (f"uncleaned AMI {made.image}", lambda: ec2.deregister_image(ImageId=made.image))
        )
    for snap in made.snapshots:
        steps.append((f"snapshot {snap}", lambda snap=snap: ec2.delete_snapshot(SnapshotId=snap)))
    for what, step in steps:
        try:
            step()
        except Exception:  # named in the one line the caller raises
            left.append(what)
    return left


def bake_aws(plan: Bake, sess: Any, *, wait_s: int = 3600, console: Console) -> str:
    """An AMI of the node that holds none of its secrets; the AMI id.

    create_image of the node as it runs (no reboot) gives a temporary, uncleaned AMI; a
    builder instance started from it (outside the cluster: no cluster tag, the subnet's
    default security group, no key pair) runs clean.sh at boot and powers off; the AMI is
    made of that stopped builder and tagged; the builder, the uncleaned AMI and its
    snapshots are removed again, whatever happened (what could not be is named)."""
    from .sources.aws.session import aws_errors, ec2_client, endpoint  # noqa: PLC0415

    ec2 = ec2_client(sess)
    deadline = time.monotonic() + wait_s
    region, url = plan.region or sess.region_name, endpoint(ec2)
    with aws_errors(region, url):
        node = _node_instance(ec2, plan)
    made = _Scratch()
    try:
        with aws_errors(region, url):
            image_id = _bake_steps(ec2, plan, node, made, deadline, console)
    except BaseException as exc:
        left = _remove_scratch(ec2, made)
        if not left:
            raise
        note = (
            f"; left {', '.join(left)} (the uncleaned copy holds the node's keys): remove "
            "them in the EC2 console"
        )
        if isinstance(exc, DsclusterError):
            raise DsclusterError(f"{exc}{note}") from exc
        console.print(f"bake stopped{note}", markup=False, highlight=False)
        raise
    left = _remove_scratch(ec2, made)
    if left:
        raise DsclusterError(
            f"baked AMI {image_id}, but could not remove {', '.join(left)} (the uncleaned copy "
            "holds the node's keys): remove them in the EC2 console"
        )
    return image_id


def _bake_steps(
    ec2: Any, plan: Bake, node: dict[str, Any], made: _Scratch, deadline: float, console: Console
) -> str:
    """The uncleaned copy, the builder cleaning itself, the AMI of the stopped builder."""
    from botocore.exceptions import WaiterError  # noqa: PLC0415

    from .sources.aws.config import METADATA_OPTIONS, root_volume  # noqa: PLC0415

    scratch_tags = [{"Key": TEMP_TAG, "Value": plan.cluster}]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    console.print(f"create_image of {plan.instance_id} ({plan.host}), no reboot: an uncleaned copy")
    made.image = ec2.create_image(
        InstanceId=plan.instance_id,
        Name=f"dscluster-bake-uncleaned-{plan.cluster}-{plan.instance_id}-{stamp}",
        Description=f"dscluster image bake: uncleaned copy of {plan.host}, removed after the bake",
        NoReboot=True,
        TagSpecifications=[{"ResourceType": "image", "Tags": scratch_tags}],
    )["ImageId"]
    _wait(ec2, "image_available", deadline, ImageIds=[made.image])
    (copy,) = ec2.describe_images(ImageIds=[made.image])["Images"]
    made.snapshots = [
        str(m["Ebs"]["SnapshotId"])
        for m in copy.get("BlockDeviceMappings") or []
        if (m.get("Ebs") or {}).get("SnapshotId")
    ]
    builder_tags = [*scratch_tags, {"Key": "Name", "Value": f"dscluster-bake-{plan.cluster}"}]
    params: dict[str, Any] = {
        "ImageId": made.image,
        "InstanceType": node["InstanceType"],
        "MinCount": 1,
        "MaxCount": 1,
        # no job's imports compiled at the builder's boot: its prefix is the venv's bytecode
        "UserData": builder_user_data(plan.user, clean_args(plan, warm=False)[2:]),
        "InstanceInitiatedShutdownBehavior": "stop",
        "MetadataOptions": METADATA_OPTIONS,
        "BlockDeviceMappings": root_volume(copy, made.image),
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": builder_tags} for kind in ("instance", "volume")
        ],
    }
    if node.get("SubnetId"):
        params["SubnetId"] = node["SubnetId"]
    made.builder = str(ec2.run_instances(**params)["Instances"][0]["InstanceId"])
    console.print(f"builder {made.builder} cleans the copy at boot, then powers off")
    try:
        _wait(ec2, "instance_stopped", deadline, InstanceIds=[made.builder])
    except WaiterError as exc:
        raise DsclusterError(
            f"builder instance {made.builder} did not clean itself and stop in time (its AMI "
            "must run cloud-init user data; see its console output); nothing was baked; bake "
            "again, or bake another --node"
        ) from exc
    console.print(f"create_image of the stopped builder {made.builder}: {plan.name}")
    tags = [{"Key": f"{TAG_PREFIX}-{k}", "Value": v} for k, v in plan.labels().items() if v]
    tags.append({"Key": "Name", "Value": plan.name})
    image_id = str(
        ec2.create_image(
            InstanceId=made.builder,
            Name=plan.name,
            Description=(
                f"dscluster: {plan.cluster}/{plan.host}, torch {plan.versions.get('torch')}, "
                f"deepspeed {plan.versions.get('deepspeed')}"
            ),
            TagSpecifications=[{"ResourceType": "image", "Tags": tags}],
        )["ImageId"]
    )
    _wait(ec2, "image_available", deadline, ImageIds=[image_id])
    return image_id
