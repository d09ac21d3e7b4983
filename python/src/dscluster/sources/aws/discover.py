"""`dscluster inventory aws`: running EC2 instances of a cluster -> its nodes -> a Cluster.

Host keys: a node's first SSH connection must not trust a key it is merely shown. cloud-init
prints each instance's SSH host keys to the serial console at first boot, between
`-----BEGIN SSH HOST KEY KEYS-----` and `-----END SSH HOST KEY KEYS-----`; EC2 returns that
console through the authenticated API (GetConsoleOutput), a channel already trusted. Those keys
go into the cluster's known_hosts, and StrictHostKeyChecking=yes refuses any other key. No host
is ever trusted on first use: a host whose console shows no keys (yet) and that the cluster's
known_hosts does not already pin stops the command (one line: wait and run it again).

Instances are those tagged `dscluster:cluster=<name>` and running; stopped, stopping and
terminated ones are ignored. Pending ones stop the command (one line: wait and run again):
an inventory must not half-describe a cluster that is still starting.

What each host is expected to carry (accelerator kind and count, EFA) comes from
`describe_instance_types`; the roles detect the real thing on the node, this is the
cross-check and the slot count of the first hostfile, written before any SSH.

Host keys come in `discover` (instances -> nodes); `describe` turns the nodes into the
cluster's inventory; `describe_cluster` is this source's entry in the route (sources.describe).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import pathlib
import re
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.table import Table

from ...errors import DsclusterError
from ...paths import inventory_dir, state_dir
from ...validate import MAX_SLOTS, read_text
from ..cluster import Cluster, Written, write
from ..cluster import Node as ClusterNode
from ..names import HOSTNAME_RE
from .config import CLUSTER_TAG, HEAD_ROLE, ROLE_TAG, cluster_filter, tag_value
from .session import aws_errors, ec2_client, endpoint, error_code

# DescribeInstances takes MaxResults 5..1000; 200 keeps each response small and is one page per
# 200 instances on AWS (moto pages by reservation).
INSTANCES_PAGE_SIZE = 200
# DescribeInstanceTypes / DescribeImages: at most 100 names per call (EC2 filter value limit
# kept well inside; the brief and AWS both use batches of 100).
BATCH = 100

LIVE_STATES = ["pending", "running"]
# Accelerators AWS does not report in DescribeInstanceTypes (no GpuInfo/NeuronInfo entry).
# Source for dl1.24xlarge: AWS Compute Blog, "Amazon EC2 DL1 instances Deep Dive"
# (https://aws.amazon.com/blogs/compute/amazon-ec2-dl1-instances-deep-dive/): "eight Intel-Habana
# Gaudi accelerators ... the instance supports four EFA ENIs". Used only where AWS reports no
# accelerator for the type; EFA support then comes from AWS when AWS knows the type.
# (dl2q.24xlarge carries Qualcomm Cloud AI 100 cards, which DeepSpeed does not drive: not here.)
UNREPORTED_ACCELERATORS: dict[str, tuple[str, int, int]] = {
    # type: (accelerator kind, count, EFA interfaces)
    "dl1.24xlarge": ("hpu", 8, 4),
}

# AMI family -> (SSH user, patterns in the AMI's PlatformDetails / Name / Description).
# Users per family as documented in the EC2 user guide ("Connect to your Linux instance":
# default user names) and by each distribution's cloud images.
AMI_FAMILIES: list[tuple[str, str | None, re.Pattern[str]]] = [
    ("windows", None, re.compile(r"windows", re.I)),
    ("ubuntu", "ubuntu", re.compile(r"ubuntu", re.I)),
    ("debian", "admin", re.compile(r"debian", re.I)),
    ("amazon_linux", "ec2-user", re.compile(r"amazon linux|amzn|\bal2023\b|\bal2\b", re.I)),
    ("rhel", "ec2-user", re.compile(r"red hat|\brhel", re.I)),
    ("rocky", "rocky", re.compile(r"rocky", re.I)),
    ("almalinux", "ec2-user", re.compile(r"almalinux", re.I)),
    ("centos", "centos", re.compile(r"centos", re.I)),
    ("fedora", "fedora", re.compile(r"fedora", re.I)),
    ("suse", "ec2-user", re.compile(r"suse|\bsles\b", re.I)),
]


@dataclasses.dataclass(frozen=True)
class TypeInfo:
    """What AWS says an instance type carries."""

    name: str
    accelerator: str  # cpu | cuda | hpu | neuron
    count: int
    efa: bool
    max_efa: int
    source: str  # describe_instance_types | table | unknown
    note: str = ""

    def slots(self, cpu_slots: int) -> int:
        return self.count if self.accelerator != "cpu" else cpu_slots


_HOST_KEYS_BLOCK = re.compile(
    r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S
)
_HOST_KEY = re.compile(
    r"(?:^|\s)(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521))\s+([A-Za-z0-9+/]+={0,3})(?=\s|$)"
)
CONSOLE_WORKERS = 16


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    instance: dict[str, Any]
    info: TypeInfo
    family: str
    user: str
    key_file: str | None
    address: str
    slots: int
    host_keys: tuple[str, ...] = ()  # "type base64" from the console, empty when none

    @property
    def instance_id(self) -> str:
        return str(self.instance["InstanceId"])

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces attached (InterfaceType efa or efa-only): the devices libfabric
        should list on the node, which doctor's fabric check counts."""
        return sum(
            1
            for nic in self.instance.get("NetworkInterfaces") or ()
            if nic.get("InterfaceType") in ("efa", "efa-only")
        )


@dataclasses.dataclass(frozen=True)
class Result:
    hosts_yml: pathlib.Path
    hostfile: pathlib.Path
    nodes: list[Node]
    region: str
    warnings: list[str]

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)


@dataclasses.dataclass(frozen=True)
class Options:
    """What `dscluster inventory aws` lets a user choose: the keywords of discover,
    describe_cluster and write_inventory."""

    head_tag: tuple[str, str] = (ROLE_TAG, HEAD_ROLE)
    user: str | None = None
    key_file: str | None = None
    public: bool = False
    cpu_slots: int = 1
    console_keys: bool = True


@dataclasses.dataclass(frozen=True)
class Found:
    """What discovery learnt beyond the inventory (Cluster.found), for the command's summary."""

    nodes: list[Node]
    region: str
    warnings: list[str]


# ---------------------------------------------------------------- AWS reads


def _batches(items: list[str], size: int = BATCH) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def live_instances(ec2: Any, cluster: str, states: list[str]) -> list[dict[str, Any]]:
    """Every instance of the cluster in one of `states`, through the paginator."""
    result = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[cluster_filter(cluster), {"Name": "instance-state-name", "Values": states}],
        PaginationConfig={"PageSize": INSTANCES_PAGE_SIZE},
    )
    for page in pages:
        for reservation in page.get("Reservations", []):
            result.extend(reservation.get("Instances", []))
    return result


def cluster_instances(ec2: Any, cluster: str) -> list[dict[str, Any]]:
    """Every pending/running instance tagged with the cluster."""
    return live_instances(ec2, cluster, LIVE_STATES)


def _from_aws(item: dict[str, Any]) -> TypeInfo:
    name = item["InstanceType"]
    net = item.get("NetworkInfo") or {}
    efa = bool(net.get("EfaSupported"))
    max_efa = int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0) if efa else 0
    gpus = (item.get("GpuInfo") or {}).get("Gpus") or []
    neuron = (item.get("NeuronInfo") or {}).get("NeuronDevices") or []
    if gpus:
        makers = {str(g.get("Manufacturer", "")).lower() for g in gpus}
        count = sum(int(g.get("Count") or 0) for g in gpus)
        if makers == {"nvidia"}:
            return TypeInfo(name, "cuda", count, efa, max_efa, "describe_instance_types")
        if makers <= {"habana", "intel"} and all(
            "gaudi" in str(g.get("Name", "")).lower() for g in gpus
        ):
            return TypeInfo(name, "hpu", count, efa, max_efa, "describe_instance_types")
        return TypeInfo(
            name,
            "cpu",
            0,
            efa,
            max_efa,
            "describe_instance_types",
            note=f"{name} has {count} {'/'.join(sorted(makers))} GPU(s) that DeepSpeed here "
            "does not drive; counted as a CPU host",
        )
    if neuron:
        count = sum(int(d.get("Count") or 0) for d in neuron)
        return TypeInfo(name, "neuron", count, efa, max_efa, "describe_instance_types")
    if name in UNREPORTED_ACCELERATORS:
        kind, count, _ = UNREPORTED_ACCELERATORS[name]
        return TypeInfo(name, kind, count, efa, max_efa, "table")
    return TypeInfo(name, "cpu", 0, efa, max_efa, "describe_instance_types")


def instance_types(ec2: Any, names: Iterable[str]) -> tuple[dict[str, TypeInfo], list[str]]:
    """TypeInfo per type (batches of 100, paginated), and a warning per type AWS does not know.

    A filter (not InstanceTypes=) is used so that one type unknown to the endpoint does not
    fail the whole batch with InvalidInstanceType.
    """
    wanted = sorted(set(names))
    found: dict[str, TypeInfo] = {}
    paginator = ec2.get_paginator("describe_instance_types")
    for batch in _batches(wanted):
        pages = paginator.paginate(Filters=[{"Name": "instance-type", "Values": batch}])
        for page in pages:
            for item in page.get("InstanceTypes", []):
                info = _from_aws(item)
                found[info.name] = info
    warnings = []
    for name in wanted:
        if name in found:
            continue
        if name in UNREPORTED_ACCELERATORS:
            kind, count, max_efa = UNREPORTED_ACCELERATORS[name]
            found[name] = TypeInfo(name, kind, count, max_efa > 0, max_efa, "table")
        else:
            found[name] = TypeInfo(name, "cpu", 0, False, 0, "unknown")
            warnings.append(
                f"EC2 does not describe instance type {name}; its hosts are expected to be "
                "CPU-only without EFA (the roles detect the real accelerators on the node)"
            )
    return found, warnings


def images(ec2: Any, image_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """describe_images for the AMIs in use (batches of 100, paginated; gone AMIs just absent)."""
    wanted = sorted(set(image_ids))
    found: dict[str, dict[str, Any]] = {}
    paginator = ec2.get_paginator("describe_images")
    for batch in _batches(wanted):
        for page in paginator.paginate(Filters=[{"Name": "image-id", "Values": batch}]):
            for image in page.get("Images", []):
                found[image["ImageId"]] = image
    return found


def ami_family(image: dict[str, Any] | None) -> tuple[str, str | None]:
    """(family, default SSH user) of an AMI; ("unknown", None) when nothing says."""
    if not image:
        return "unknown", None
    platform = str(image.get("PlatformDetails") or "")
    texts = [] if platform in ("", "Linux/UNIX") else [platform]
    texts += [str(image.get("Name") or ""), str(image.get("Description") or "")]
    if str(image.get("Platform") or "").lower() == "windows":
        texts.insert(0, "windows")
    for text in texts:
        for family, user, pattern in AMI_FAMILIES:
            if pattern.search(text):
                return family, user
    return "unknown", None


def console_host_keys(output: str) -> tuple[str, ...]:
    """`type base64` host keys cloud-init printed to the console (first boot), in order."""
    keys: list[str] = []
    for block in _HOST_KEYS_BLOCK.findall(output):
        for line in block.splitlines():
            match = _HOST_KEY.search(line)
            if not match:
                continue
            try:
                base64.b64decode(match.group(2), validate=True)
            except (binascii.Error, ValueError):
                continue
            key = f"{match.group(1)} {match.group(2)}"
            if key not in keys:
                keys.append(key)
    return tuple(keys)


def fetch_host_keys(ec2: Any, instance_ids: list[str]) -> dict[str, tuple[str, ...]]:
    """Host keys per instance from GetConsoleOutput (in parallel; boto3 clients are
    thread-safe). An instance whose console is empty or lacks the block gets ()."""

    def one(iid: str) -> tuple[str, tuple[str, ...]]:
        try:
            encoded = ec2.get_console_output(InstanceId=iid).get("Output") or ""
        except Exception as exc:
            code = error_code(exc)
            if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
                raise DsclusterError(
                    f"not allowed to read the console output of {iid} (ec2:GetConsoleOutput), "
                    "where the SSH host keys are; grant that permission, or pass "
                    "--no-console-keys and put their host keys in the cluster's known_hosts "
                    "yourself"
                ) from exc
            raise
        try:
            text = base64.b64decode(encoded).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            text = encoded
        return iid, console_host_keys(text)

    with ThreadPoolExecutor(max_workers=CONSOLE_WORKERS) as pool:
        return dict(pool.map(one, instance_ids))


def pinned_hosts(known_hosts: pathlib.Path) -> set[str]:
    """Host names and addresses a known_hosts file holds a plain key line for."""
    if not known_hosts.exists():
        return set()
    found: set[str] = set()
    for line in read_text(known_hosts, "known_hosts file").splitlines():
        fields = line.split()
        # marker lines (@revoked, @cert-authority) pin nothing; hashed names are not ours
        if len(fields) >= 3 and not fields[0].startswith(("@", "|", "#")):
            found.update(fields[0].split(","))
    return found


def merge_known_hosts(existing: str, nodes: list[Node]) -> str:
    """known_hosts text: lines naming any node (by name or address) replaced by the keys its
    console showed; other lines kept. Nodes without console keys keep what was there."""
    with_keys = [n for n in nodes if n.host_keys]
    names = {x for n in with_keys for x in (n.name, n.address)}
    kept = []
    for line in existing.splitlines():
        hosts = set(line.split(" ", 1)[0].split(",")) if line.strip() else set()
        if hosts & names:
            continue
        kept.append(line)
    for node in with_keys:
        kept.extend(f"{node.name},{node.address} {key}" for key in node.host_keys)
    return "\n".join(kept) + ("\n" if kept else "")


# ---------------------------------------------------------------- pure choices


def _launch_key(inst: dict[str, Any]) -> tuple[Any, ...]:
    launch = inst.get("LaunchTime") or datetime.datetime.max.replace(tzinfo=datetime.UTC)
    if isinstance(launch, str):
        launch = datetime.datetime.fromisoformat(launch.replace("Z", "+00:00"))
    return (launch, int(inst.get("AmiLaunchIndex") or 0), str(inst.get("InstanceId")))


def choose_head(instances: list[dict[str, Any]], head_tag: tuple[str, str]) -> dict[str, Any]:
    """The instance tagged as head, else the lowest AmiLaunchIndex (ties: launch time, id)."""
    key, value = head_tag
    tagged = [i for i in instances if tag_value(i, key) == value]
    if len(tagged) > 1:
        ids = ", ".join(sorted(str(i["InstanceId"]) for i in tagged))
        raise DsclusterError(
            f"{len(tagged)} running instances carry the head tag {key}={value} ({ids}); "
            "keep that tag on exactly one of them"
        )
    if tagged:
        return tagged[0]
    return min(instances, key=lambda i: (int(i.get("AmiLaunchIndex") or 0), _launch_key(i)))


def host_names(instances: list[dict[str, Any]]) -> dict[str, str]:
    """instance id -> a stable readable host name.

    The `Name` tag where it is a valid host name and unique in the cluster, else the short
    private DNS name (ip-10-0-0-12), else the instance id.
    """
    names = Counter(tag_value(i, "Name") for i in instances)
    result: dict[str, str] = {}
    taken: set[str] = set()
    for inst in sorted(instances, key=_launch_key):
        iid = str(inst["InstanceId"])
        candidates = []
        tag = tag_value(inst, "Name")
        if tag and names[tag] == 1:
            candidates.append(tag)
        dns = str(inst.get("PrivateDnsName") or "").split(".")[0]
        if dns:
            candidates.append(dns)
        candidates.append(iid)
        name = next(c for c in candidates if HOSTNAME_RE.fullmatch(c) and c not in taken)
        taken.add(name)
        result[iid] = name
    return result


# ---------------------------------------------------------------- instances -> nodes


@dataclasses.dataclass(frozen=True)
class _Read:
    """What EC2 says about the cluster's running instances."""

    running: list[dict[str, Any]]
    types: dict[str, TypeInfo]
    amis: dict[str, dict[str, Any]]
    keys: dict[str, tuple[str, ...]]  # instance id -> console host keys
    warnings: list[str]


@dataclasses.dataclass
class _Refused:
    """Instances no node can be made of, each kind refused in one line after the loop."""

    windows: list[str] = dataclasses.field(default_factory=list)
    unknown: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # AMI -> ids
    no_address: list[str] = dataclasses.field(default_factory=list)

    def check(self, public: bool) -> None:
        if self.windows:
            raise DsclusterError(
                f"instances {', '.join(self.windows)} run Windows, which dscluster cannot "
                f"provision; remove their {CLUSTER_TAG} tag"
            )
        if self.unknown:
            label, ids = next(iter(self.unknown.items()))
            raise DsclusterError(
                f"cannot tell the SSH user of AMI {label} used by {', '.join(ids)}; pass --user"
            )
        if self.no_address:
            kind = "public" if public else "private"
            raise DsclusterError(
                f"instances {', '.join(self.no_address)} have no {kind} address; "
                + ("drop --public or give them public IPs" if public else "check their network")
            )


def _read(sess: Any, cluster: str, console_keys: bool) -> _Read:
    """The running instances (none pending), their types, AMIs and console host keys."""
    region = sess.region_name
    ec2 = ec2_client(sess)
    with aws_errors(region, endpoint(ec2)):
        found = cluster_instances(ec2, cluster)
        pending = sorted(str(i["InstanceId"]) for i in found if i["State"]["Name"] == "pending")
        if pending:
            raise DsclusterError(
                f"{len(pending)} instances of cluster {cluster} in {region} are still pending "
                f"({', '.join(pending[:5])}{', ...' if len(pending) > 5 else ''}); wait until "
                "they are running and run 'dscluster inventory aws' again"
            )
        running = [i for i in found if i["State"]["Name"] == "running"]
        if not running:
            raise DsclusterError(
                f"no running EC2 instances tagged {CLUSTER_TAG}={cluster} in region {region}; "
                "tag them (or run 'dscluster aws up'), or check --region/--profile"
            )
        types, warnings = instance_types(ec2, (str(i["InstanceType"]) for i in running))
        amis = images(ec2, (str(i.get("ImageId")) for i in running if i.get("ImageId")))
        keys = fetch_host_keys(ec2, [str(i["InstanceId"]) for i in running]) if console_keys else {}
    return _Read(running, types, amis, keys, warnings)


def _key_file(inst: dict[str, Any], key_file: str | None) -> str | None:
    """--key-file, else the instance's EC2 key pair as ~/.ssh/<KeyName>.pem, else none."""
    if key_file:
        return str(pathlib.Path(key_file).expanduser().resolve())
    if inst.get("KeyName"):
        return f"~/.ssh/{inst['KeyName']}.pem"
    return None


def _node(
    inst: dict[str, Any], name: str, read: _Read, opts: Options, refused: _Refused
) -> Node | None:
    """One instance as a node, or None when refused (noted in `refused`)."""
    iid = str(inst["InstanceId"])
    image = read.amis.get(str(inst.get("ImageId")))
    family, family_user = ami_family(image)
    if family == "windows":
        refused.windows.append(iid)
        return None
    if not (opts.user or family_user):
        label = f"{inst.get('ImageId')} ({image.get('Name')})" if image else inst.get("ImageId")
        refused.unknown.setdefault(str(label), []).append(iid)
        return None
    if opts.public:
        address = inst.get("PublicIpAddress") or inst.get("PublicDnsName")
    else:
        address = inst.get("PrivateIpAddress")
    if not address:
        refused.no_address.append(iid)
        return None
    info = read.types[str(inst["InstanceType"])]
    return Node(
        name=name,
        instance=inst,
        info=info,
        family=family,
        user=str(opts.user or family_user),
        key_file=_key_file(inst, opts.key_file),
        address=str(address),
        slots=info.slots(opts.cpu_slots),
        host_keys=read.keys.get(iid, ()),
    )


def _nodes(read: _Read, opts: Options) -> list[Node]:
    """Head first, then in launch order; refused when any instance cannot be a node."""
    head = choose_head(read.running, opts.head_tag)
    ordered = [head, *sorted((i for i in read.running if i is not head), key=_launch_key)]
    names = host_names(read.running)
    refused = _Refused()
    nodes = [
        node
        for inst in ordered
        if (node := _node(inst, names[str(inst["InstanceId"])], read, opts, refused))
    ]
    refused.check(opts.public)
    return nodes


def _some(texts: list[str]) -> str:
    """The first five, then how many more."""
    return ", ".join(texts[:5]) + (f" and {len(texts) - 5} more" if len(texts) > 5 else "")


def _key_warnings(nodes: list[Node], known_hosts: pathlib.Path, console_keys: bool) -> list[str]:
    """Refuse a node with neither console keys nor a pinned key; warn where SSH will fall back."""
    warnings = []
    pinned = pinned_hosts(known_hosts)
    # ssh looks the key up by the address it connects to (ansible_host), not the name
    keyless = [n for n in nodes if not n.host_keys and n.address not in pinned]
    if keyless and console_keys:
        shown = _some([f"{n.instance_id} ({n.name})" for n in keyless])
        raise DsclusterError(
            f"no SSH host key in the EC2 console output of {shown} yet, and none pinned in "
            f"{known_hosts}: cloud-init prints them a few minutes after first boot; wait and "
            "run 'dscluster inventory aws' again (a host key is never trusted on first use)"
        )
    if keyless:
        shown = _some([n.name for n in keyless])
        warnings.append(
            f"--no-console-keys: no host key of {shown} is pinned in {known_hosts}; SSH to "
            "them is refused (StrictHostKeyChecking=yes) until their keys are added there"
        )
    if not any(n.key_file for n in nodes):
        warnings.append(
            "no instance has an EC2 key pair and no --key-file was given; SSH will use your "
            "agent or ~/.ssh/config"
        )
    return warnings


def discover(
    sess: Any, cluster: str, *, known_hosts: pathlib.Path | None = None, **options: Any
) -> tuple[list[Node], list[str]]:
    """The cluster's nodes (head first, then in launch order) and warnings; no writes.
    `options`: the fields of Options.

    A node whose console shows no host key must already be pinned in known_hosts (the
    cluster's, by default), else the command stops: nothing is trusted on first use."""
    opts = Options(**options)
    known_hosts = known_hosts or state_dir(cluster) / "known_hosts"
    if not 1 <= opts.cpu_slots <= MAX_SLOTS:
        raise DsclusterError(
            f"--slots {opts.cpu_slots} is out of range; give slots per CPU host from 1 to "
            f"{MAX_SLOTS}"
        )
    read = _read(sess, cluster, opts.console_keys)
    nodes = _nodes(read, opts)
    warnings = read.warnings + sorted({n.info.note for n in nodes if n.info.note})
    warnings += _key_warnings(nodes, known_hosts, opts.console_keys)
    return nodes, warnings


# ---------------------------------------------------------------- nodes -> cluster


def _host_vars(node: Node) -> dict[str, Any]:
    return {
        "ansible_host": node.address,
        "dscluster_instance_id": node.instance_id,
        "dscluster_instance_type": node.info.name,
        "dscluster_expected_accelerator": node.info.accelerator,
        "dscluster_expected_slots": node.slots,
        "dscluster_efa_supported": node.info.efa,
        "dscluster_expected_efa": node.efa_interfaces,
    }


def describe(
    cluster: str, region: str, nodes: list[Node], cpu_slots: int, known_hosts: pathlib.Path
) -> Cluster:
    """The cluster: head/workers with host vars, one group per AMI family (user, key)."""
    groups: dict[str, Any] = {}
    for family in sorted({n.family for n in nodes}):
        members = [n for n in nodes if n.family == family]
        users = {n.user for n in members}
        keys = {n.key_file for n in members}
        group_vars: dict[str, Any] = {}
        if len(users) == 1:
            group_vars["ansible_user"] = users.pop()
        if len(keys) == 1 and None not in keys:
            group_vars["ansible_ssh_private_key_file"] = keys.pop()
        hosts: dict[str, Any] = {}
        for n in members:
            own: dict[str, Any] = {}
            if "ansible_user" not in group_vars:
                own["ansible_user"] = n.user
            if "ansible_ssh_private_key_file" not in group_vars and n.key_file:
                own["ansible_ssh_private_key_file"] = n.key_file
            hosts[n.name] = own or None
        groups[f"aws_ami_{family}"] = {"vars": group_vars, "hosts": hosts}
    return Cluster(
        name=cluster,
        nodes=[ClusterNode(n.name, n.slots, _host_vars(n)) for n in nodes],
        vars={
            "dscluster_cluster_name": cluster,
            "dscluster_source": "aws",
            "dscluster_aws_region": region,
            "dscluster_cpu_slots": cpu_slots,
            "ansible_ssh_common_args": (
                "-o ConnectTimeout=15 -o StrictHostKeyChecking=yes "
                f"-o UserKnownHostsFile={known_hosts}"
            ),
        },
        header=(
            "---\n"
            f"# Written by `dscluster inventory aws --cluster {cluster}` from the running EC2\n"
            f"# instances tagged {CLUSTER_TAG}={cluster} in {region}. Expected accelerators, "
            "slots\n"
            "# and EFA come from DescribeInstanceTypes; the roles detect the real ones on each "
            "node.\n"
            "# SSH user and key per AMI family: the aws_ami_* groups. Host keys: from each\n"
            f"# instance's console output (GetConsoleOutput) into {known_hosts}.\n"
            "# Run the command again to refresh; edits here are overwritten then.\n"
        ),
        groups=groups,
        known_hosts=known_hosts,
        known_hosts_text=merge_known_hosts(
            read_text(known_hosts, "known_hosts file") if known_hosts.exists() else "", nodes
        ),
    )


def inventory_data(
    cluster: str, region: str, nodes: list[Node], cpu_slots: int, known_hosts: pathlib.Path
) -> dict[str, Any]:
    """The hosts.yml document."""
    return describe(cluster, region, nodes, cpu_slots, known_hosts).data()


def describe_cluster(
    sess: Any, cluster: str, *, out_dir: str | pathlib.Path | None = None, **options: Any
) -> Cluster:
    """This source in the route (sources.describe): the cluster's running instances as a
    Cluster for inventories/aws (or `out_dir`), with Found; nothing is written."""
    known_hosts = state_dir(cluster) / "known_hosts"
    nodes, warnings = discover(sess, cluster, known_hosts=known_hosts, **options)
    region = str(sess.region_name)
    out = pathlib.Path(out_dir).expanduser() if out_dir else inventory_dir("aws")
    described = describe(cluster, region, nodes, Options(**options).cpu_slots, known_hosts)
    return dataclasses.replace(described, out=out, found=Found(nodes, region, warnings))


def written_result(described: Cluster, written: Written) -> Result:
    """What `inventory aws` reports of a cluster describe_cluster described and write wrote."""
    assert written.hostfile is not None
    found: Found = described.found
    return Result(written.hosts_yml, written.hostfile, found.nodes, found.region, found.warnings)


def write_inventory(
    sess: Any, cluster: str, *, out_dir: str | pathlib.Path | None = None, **options: Any
) -> Result:
    """Discover, render both files, then write them (nothing is written on any error)."""
    described = describe_cluster(sess, cluster, out_dir=out_dir, **options)
    return written_result(described, write(described))


def summary_table(result: Result) -> Table:
    table = Table(title=f"EC2 hosts in {result.region} (head first)")
    cols = (
        "host",
        "instance",
        "type",
        "accelerator",
        "slots",
        "EFA",
        "ssh user",
        "address",
        "keys",
    )
    for col in cols:
        table.add_column(col)
    for n in result.nodes:
        table.add_row(
            n.name,
            n.instance_id,
            n.info.name,
            n.info.accelerator + (" (table)" if n.info.source == "table" else ""),
            str(n.slots),
            "yes" if n.info.efa else "no",
            n.user,
            n.address,
            str(len(n.host_keys)) if n.host_keys else "-",
        )
    return table
