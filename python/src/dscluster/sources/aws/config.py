"""How dscluster sets up the EC2 objects of a cluster, and checks the options that set them.

The tags that mark what dscluster made (`dscluster:cluster=<name>`, the head's role, a baked
AMI's); the shape of each `aws up` option; the cluster placement group and the security group
`dscluster-<name>` (all traffic within itself for EFA, SSH from --ssh-cidr); the subnet, the
AMI (an id or an SSM parameter) and the key pair; what every instance starts with (IMDSv2
only, the root volume encrypted, the network interface, cloud-config of a baked AMI).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Callable
from typing import Any

from ...errors import DsclusterError
from ...text import squeeze
from ...validate import MAX_NODES
from .session import WAITER_DELAY_S, aws_errors, client, endpoint, error_code

CLUSTER_TAG = "dscluster:cluster"
ROLE_TAG = "dscluster:role"
HEAD_ROLE = "head"

# The tag `dscluster image bake` puts on the AMIs it makes (bake.TAG_PREFIX + "-cluster").
BAKED_CLUSTER_TAG = "dscluster:baked-cluster"
BAKED_USER_TAG = "dscluster:baked-user"
# What `up` and `image bake`'s builder start with: IMDSv2 only, so a job's proxied or
# redirected GET never reads the instance role's credentials, and hop limit 1 (not 2), so no
# container behind a bridge on the node gets a token either (only cloud-init, on the host,
# reads the metadata).
METADATA_OPTIONS = {
    "HttpTokens": "required",
    "HttpEndpoint": "enabled",
    "HttpPutResponseHopLimit": 1,
}
# After termination, EC2 keeps the instances' network interfaces for a while; the security group
# cannot be deleted until they are gone (DependencyViolation). Retry this long at most.
SG_DELETE_RETRY_S = 180

Say = Callable[[str], None]


# ---------------------------------------------------------------- local shape checks
#
# Each check raises a DsclusterError naming the value and the fix; the CLI turns them into
# argparse types (validate.name_type), instance.up runs them again for library callers.
# Every pattern is a full match.

INSTANCE_TYPE_RE = re.compile(r"[a-z][a-z0-9-]*[a-z0-9]\.[a-z0-9][a-z0-9-]*")
SUBNET_RE = re.compile(r"subnet-[0-9a-f]{8,17}")
AMI_RE = re.compile(r"ami-[0-9a-f]{8,17}")
# An SSM parameter name holding an AMI id (e.g. /aws/service/ami-amazon-linux-latest/...).
SSM_PARAMETER_RE = re.compile(r"/[A-Za-z0-9_.\-/]{1,2047}")
# EC2 key pairs: up to 255 ASCII characters, no leading or trailing space. dscluster also
# refuses '/' and control characters: the name becomes ~/.ssh/<name>.pem in the inventory.
KEY_NAME_RE = re.compile(r"[!-.0-~]([ !-.0-~]{0,253}[!-.0-~])?")


def check_instance_type(name: str) -> None:
    if not INSTANCE_TYPE_RE.fullmatch(name):
        raise DsclusterError(
            f"instance type {name!r} is not an EC2 type name (family.size); give one like "
            "p4d.24xlarge or c5.2xlarge"
        )


def check_subnet(subnet: str) -> None:
    if not SUBNET_RE.fullmatch(subnet):
        raise DsclusterError(
            f"subnet {subnet!r} is not a subnet id; give one like subnet-0123456789abcdef0"
        )


def check_ami(ami: str) -> None:
    if not (AMI_RE.fullmatch(ami) or SSM_PARAMETER_RE.fullmatch(ami)):
        raise DsclusterError(
            f"AMI {ami!r} is neither an AMI id nor an SSM parameter name; give one like "
            "ami-0123456789abcdef0, or a parameter name starting with '/'"
        )


def check_key_name(name: str) -> None:
    if name.endswith(".pem") or "/" in name:
        raise DsclusterError(
            f"key pair name {name!r} looks like a file; give the EC2 key pair's name "
            "(e.g. train for ~/.ssh/train.pem)"
        )
    if not KEY_NAME_RE.fullmatch(name):
        raise DsclusterError(
            f"key pair name {name!r} is not an EC2 key pair name; use 1-255 printable ASCII "
            "characters without leading or trailing spaces (e.g. train)"
        )


def check_cidr(cidr: str) -> None:
    import ipaddress  # noqa: PLC0415

    try:
        if "/" not in cidr:
            raise ValueError("no prefix length")
        ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise DsclusterError(
            f"SSH CIDR {cidr!r} is not a network ({squeeze(exc)}); give address/prefix "
            "with no host bits, e.g. 203.0.113.7/32 or 10.0.0.0/16"
        ) from None


def check_world_ssh(ssh_cidr: str | None, allow_world_ssh: bool) -> None:
    """Refuse an SSH rule open to the whole internet unless asked for by name."""
    import ipaddress  # noqa: PLC0415

    if ssh_cidr is None or allow_world_ssh:
        return
    try:
        prefix = ipaddress.ip_network(ssh_cidr, strict=False).prefixlen
    except ValueError:
        return  # check_cidr names the shape
    if prefix == 0:
        raise DsclusterError(
            f"--ssh-cidr {ssh_cidr} opens SSH to the whole internet; give your own network "
            "(e.g. 203.0.113.7/32), or add --allow-world-ssh if you mean it"
        )


@dataclasses.dataclass(frozen=True)
class UpOptions:
    """What `dscluster aws up` is asked for: the keywords of instance.up."""

    instance_type: str
    count: int
    efa: bool = False
    subnet: str | None = None
    ami: str | None = None
    key_name: str | None = None
    ssh_cidr: str | None = None
    wait_s: int = 600
    allow_world_ssh: bool = False


def check_up_options(opts: UpOptions) -> None:
    """Every refusal `up` can make from its options alone, before any AWS call."""
    instance_type, count, subnet, ami = opts.instance_type, opts.count, opts.subnet, opts.ami
    key_name, ssh_cidr, wait_s = opts.key_name, opts.ssh_cidr, opts.wait_s
    check_instance_type(instance_type)
    if not 1 <= count <= MAX_NODES:
        raise DsclusterError(
            f"--count {count} is out of range; a cluster has 1 to {MAX_NODES} instances"
        )
    if subnet is not None:
        check_subnet(subnet)
    if not ami:
        raise DsclusterError(
            "no AMI: pass --ami <ami-id> (e.g. an AWS Deep Learning AMI of your region), or an "
            "SSM parameter name starting with '/' that holds one; dscluster does not guess"
        )
    check_ami(ami)
    if key_name is not None:
        check_key_name(key_name)
    if ssh_cidr is not None:
        check_cidr(ssh_cidr)
        check_world_ssh(ssh_cidr, opts.allow_world_ssh)
    if wait_s < 0:
        raise DsclusterError(f"--wait {wait_s} is negative; give seconds, e.g. 600")


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    for tag in resource.get("Tags") or []:
        if tag.get("Key") == key:
            return str(tag.get("Value", ""))
    return None


def cluster_filter(cluster: str) -> dict[str, Any]:
    return {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}


def resource_name(cluster: str) -> str:
    return f"dscluster-{cluster}"


def tags(cluster: str) -> list[dict[str, str]]:
    return [{"Key": CLUSTER_TAG, "Value": cluster}]


# ---------------------------------------------------------------- finders


def find_placement_group(ec2: Any, cluster: str) -> dict[str, Any] | None:
    name = resource_name(cluster)
    groups = ec2.describe_placement_groups(Filters=[{"Name": "group-name", "Values": [name]}])
    for group in groups.get("PlacementGroups", []):
        if group.get("GroupName") == name and group.get("State") != "deleted":
            return group
    return None


def find_security_groups(ec2: Any, cluster: str, vpc_id: str | None) -> list[dict[str, Any]]:
    filters = [{"Name": "group-name", "Values": [resource_name(cluster)]}]
    if vpc_id:
        filters.append({"Name": "vpc-id", "Values": [vpc_id]})
    groups = []
    for page in ec2.get_paginator("describe_security_groups").paginate(Filters=filters):
        groups.extend(page.get("SecurityGroups", []))
    return groups


def _ours(resource: dict[str, Any], cluster: str, what: str, name: str) -> None:
    if tag_value(resource, CLUSTER_TAG) != cluster:
        raise DsclusterError(
            f"{what} {name} exists but is not tagged {CLUSTER_TAG}={cluster}, so dscluster did "
            f"not make it; delete or rename it, or pick another --cluster"
        )


# ---------------------------------------------------------------- what up makes or reuses


def choose_subnet(ec2: Any, subnet: str | None, region: str) -> dict[str, Any]:
    if subnet:
        found = ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": [subnet]}])
        subnets = found.get("Subnets", [])
        if not subnets:
            raise DsclusterError(f"subnet {subnet} does not exist in {region}; check --subnet")
        return subnets[0]
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
    if not vpcs:
        raise DsclusterError(f"region {region} has no default VPC; pass --subnet <subnet-id>")
    found = ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )
    subnets = sorted(found.get("Subnets", []), key=lambda s: (s["AvailabilityZone"], s["SubnetId"]))
    if not subnets:
        raise DsclusterError(
            f"the default VPC of {region} has no default subnet; pass --subnet <subnet-id>"
        )
    return subnets[0]


def resolve_ami(sess: Any, ami: str) -> str:
    """An AMI id as given, or the value of the SSM parameter named by `ami` (starts with /)."""
    if not ami.startswith("/"):
        return ami
    ssm = client(sess, "ssm")
    with aws_errors(sess.region_name, endpoint(ssm)):
        try:
            value = ssm.get_parameter(Name=ami).get("Parameter", {}).get("Value")
        except Exception as exc:
            if error_code(exc) == "ParameterNotFound":
                raise DsclusterError(
                    f"SSM parameter {ami} does not exist in {sess.region_name}; check --ami"
                ) from exc
            raise
    if not isinstance(value, str) or not AMI_RE.fullmatch(value):
        raise DsclusterError(
            f"SSM parameter {ami} holds {str(value)[:60]!r}, not an AMI id; check --ami"
        )
    return value


def check_key_pair(ec2: Any, key_name: str, region: str) -> None:
    pairs = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [key_name]}])
    if not pairs.get("KeyPairs"):
        raise DsclusterError(
            f"key pair {key_name} does not exist in {region}; create or import it "
            "('aws ec2 import-key-pair') or check --key-name"
        )


def ensure_placement_group(ec2: Any, cluster: str, created: list[str], say: Say) -> bool:
    """Reuse the cluster's placement group, or make it; True when this call made it."""
    name = resource_name(cluster)
    group = find_placement_group(ec2, cluster)
    if group:
        _ours(group, cluster, "placement group", name)
        if group.get("Strategy") != "cluster":
            raise DsclusterError(
                f"placement group {name} has strategy {group.get('Strategy')}, not cluster; "
                "run 'dscluster aws down' first"
            )
        return False
    ec2.create_placement_group(
        GroupName=name,
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags(cluster)}],
    )
    created.append(f"placement group {name}")
    say(f"created placement group {name} (strategy cluster)")
    return True


def _self_rule_present(permissions: list[dict[str, Any]], group_id: str) -> bool:
    return any(
        p.get("IpProtocol") == "-1"
        and any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))
        for p in permissions
    )


def ensure_security_group(
    ec2: Any, cluster: str, vpc_id: str, *, ssh_cidr: str | None, created: list[str], say: Say
) -> str:
    name = resource_name(cluster)
    groups = find_security_groups(ec2, cluster, vpc_id)
    if groups:
        group = groups[0]
        _ours(group, cluster, "security group", f"{name} ({group['GroupId']})")
        group_id = str(group["GroupId"])
    else:
        group_id = str(
            ec2.create_security_group(
                GroupName=name,
                Description=f"dscluster {cluster}: all traffic within the cluster (EFA, NCCL)",
                VpcId=vpc_id,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tags(cluster)}],
            )["GroupId"]
        )
        created.append(f"security group {name} ({group_id})")
        say(f"created security group {name} ({group_id}) in {vpc_id}")
        group = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    # EFA needs BOTH rules: AWS's EFA security group (EC2 user guide, "Get started with EFA",
    # step "Prepare an EFA-enabled security group", and the same recipe in
    # https://docs.aws.amazon.com/pcs/latest/userguide/working-with_networking_efa_create-sg.html:
    # authorize-security-group-ingress AND authorize-security-group-egress, --protocol -1,
    # --source-group <itself>) allows all traffic in from and out to the group itself. The
    # default allow-all egress rule does not count: EFA traffic needs the self-referencing one.
    self_pair = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]
    if not _self_rule_present(group.get("IpPermissions", []), group_id):
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=self_pair)
        say(f"{group_id}: inbound all traffic from itself")
    if not _self_rule_present(group.get("IpPermissionsEgress", []), group_id):
        ec2.authorize_security_group_egress(GroupId=group_id, IpPermissions=self_pair)
        say(f"{group_id}: outbound all traffic to itself")
    if ssh_cidr and not _ssh_rule_present(group.get("IpPermissions", []), ssh_cidr):
        ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=[_ssh_permission(ssh_cidr)]
        )
        say(f"{group_id}: inbound SSH from {ssh_cidr}")
    return group_id


def _ssh_rule_present(permissions: list[dict[str, Any]], ssh_cidr: str) -> bool:
    wanted = _ssh_permission(ssh_cidr)
    ranges = wanted.get("IpRanges") or wanted.get("Ipv6Ranges") or []
    key, cidr = next((k, v) for k, v in ranges[0].items() if k.startswith("CidrIp"))
    return any(
        p.get("IpProtocol") == "tcp"
        and p.get("FromPort") == 22
        and any(r.get(key) == cidr for r in p.get("IpRanges", []) + p.get("Ipv6Ranges", []))
        for p in permissions
    )


def _ssh_permission(ssh_cidr: str) -> dict[str, Any]:
    import ipaddress  # noqa: PLC0415

    net = ipaddress.ip_network(ssh_cidr, strict=True)
    ranges: dict[str, Any] = (
        {"IpRanges": [{"CidrIp": str(net), "Description": "dscluster SSH"}]}
        if net.version == 4
        else {"Ipv6Ranges": [{"CidrIpv6": str(net), "Description": "dscluster SSH"}]}
    )
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}


def root_volume(image: dict[str, Any], image_id: str) -> list[dict[str, Any]]:
    """RunInstances BlockDeviceMappings: the AMI's root device, encrypted (EBS's default key
    unless the account sets another) and removed with the instance."""
    device = image.get("RootDeviceName")
    if image.get("RootDeviceType") == "instance-store" or not device:
        raise DsclusterError(
            f"AMI {image_id} has no EBS root device ({image.get('RootDeviceType') or 'none'}); "
            "dscluster starts only EBS-backed AMIs, whose root volume it encrypts; pick another "
            "--ami"
        )
    ebs: dict[str, Any] = {"Encrypted": True, "DeleteOnTermination": True}
    for mapping in image.get("BlockDeviceMappings") or []:
        if mapping.get("DeviceName") == device:
            # the AMI's own snapshot, size and type, so that only encryption changes
            given = mapping.get("Ebs") or {}
            keep = ("SnapshotId", "VolumeSize", "VolumeType", "Iops", "Throughput")
            ebs = {k: given[k] for k in keep if k in given} | ebs
    return [{"DeviceName": str(device), "Ebs": ebs}]


def network_interfaces(subnet_id: str, group_id: str, efa: bool) -> list[dict[str, Any]]:
    """RunInstances NetworkInterfaces: the primary interface (card 0, device 0) in the cluster's
    security group, an EFA (InterfaceType efa: EFA with ENA, so it also carries IP) with --efa.

    Multi-card types (p4d, p5, trn1) reach full bandwidth only with further `efa-only`
    interfaces on their other network cards, in a per-type layout (EC2 user guide, "Maximize
    network bandwidth on Amazon EC2 instances with multiple network cards",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html); one EFA
    interface is what every EFA type accepts, and what this command makes.
    """
    nic: dict[str, Any] = {"DeviceIndex": 0, "SubnetId": subnet_id, "Groups": [group_id]}
    if efa:
        nic["InterfaceType"] = "efa"
    return [nic]


def baked_user_data(user: str = "ds") -> str:
    """cloud-config for a node started from a baked AMI: docker/bake/clean.sh once per
    instance, in cloud-init's bootcmd (before its ssh module makes the host keys and installs
    the key pair): the cluster keys, known_hosts, munge key and Slurm configuration of the
    node the AMI was made from are gone before sshd first lets anyone in, and so is what its
    training user left in its home, the job secrets and the default node-local directories
    (what an AMI baked before clean.sh took those out may hold; the builder took them out of
    a newer one, and remade its bytecode prefix, which first-boot leaves as it is)."""
    import base64  # noqa: PLC0415

    from ... import paths  # noqa: PLC0415

    script = (paths.docker_dir() / "bake" / "clean.sh").read_bytes()
    encoded = base64.b64encode(script).decode()
    command = f"echo {encoded} | base64 -d | sh -s -- {shlex.quote(user)} first-boot"
    return (
        "#cloud-config\n"
        "# dscluster: this AMI was made by `dscluster image bake`; clean it once per instance.\n"
        "bootcmd:\n"
        f"  - [cloud-init-per, instance, dscluster-baked-clean, sh, -c, {json.dumps(command)}]\n"
    )


def delete_placement_group(ec2: Any, name: str) -> None:
    ec2.delete_placement_group(GroupName=name)


def delete_security_group(ec2: Any, group_id: str) -> None:
    deadline = time.monotonic() + SG_DELETE_RETRY_S
    while True:
        try:
            ec2.delete_security_group(GroupId=group_id)
            return
        except Exception as exc:
            if error_code(exc) != "DependencyViolation" or time.monotonic() > deadline:
                raise
            time.sleep(WAITER_DELAY_S)
