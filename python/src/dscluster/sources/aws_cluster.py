"""`dscluster aws up/down`: an EC2 cluster for DeepSpeed, idempotent, removed exactly.

`up` makes (or reuses) a cluster placement group `dscluster-<name>`, a security group
`dscluster-<name>` in the subnet's VPC that lets the cluster talk to itself, and starts only
the instances missing from `--count` (IMDSv2 only, the AMI's root volume encrypted; SSH from
the whole internet only with `--allow-world-ssh`). Everything it makes carries
`dscluster:cluster=<name>` (the first head also `dscluster:role=head`); `down` finds things
by that tag and the `dscluster-<name>` names, and removes those and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Callable
from typing import Any

from ..errors import DsclusterError
from ..text import squeeze
from ..validate import MAX_NODES
from .aws import TypeInfo, instance_types
from .ec2 import (
    AMI_RE,
    CLUSTER_TAG,
    HEAD_ROLE,
    ROLE_TAG,
    aws_errors,
    check_ami,
    check_cidr,
    check_cluster_name,
    check_instance_type,
    check_key_name,
    check_subnet,
    client,
    cluster_filter,
    ec2_client,
    endpoint,
    tag_value,
)

# The tag `dscluster image bake` puts on the AMIs it makes (bake.TAG_PREFIX + "-cluster").
BAKED_CLUSTER_TAG = "dscluster:baked-cluster"
BAKED_USER_TAG = "dscluster:baked-user"
LIVE_STATES = ["pending", "running"]
NOT_GONE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
WAITER_DELAY_S = 5
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


def resource_name(cluster: str) -> str:
    return f"dscluster-{cluster}"


def _tags(cluster: str) -> list[dict[str, str]]:
    return [{"Key": CLUSTER_TAG, "Value": cluster}]


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


@dataclasses.dataclass
class UpResult:
    cluster: str
    region: str
    instance_type: str
    placement_group: str
    security_group: str
    created: list[str] = dataclasses.field(default_factory=list)  # what this run made
    existing: list[str] = dataclasses.field(default_factory=list)  # instances already there
    launched: list[str] = dataclasses.field(default_factory=list)  # instances this run started
    efa_interfaces: int = 0

    def summary(self) -> str:
        total = len(self.existing) + len(self.launched)
        if not self.created:
            return (
                f"aws cluster '{self.cluster}' in {self.region}: nothing to create; {total} "
                f"instances running or pending; next: dscluster inventory aws --cluster "
                f"{self.cluster} --region {self.region}"
            )
        return (
            f"aws cluster '{self.cluster}' in {self.region}: created {len(self.created)} objects "
            f"({len(self.launched)} instances), {total} instances in all; next: dscluster "
            f"inventory aws --cluster {self.cluster} --region {self.region}"
        )


# ---------------------------------------------------------------- finders


def live_instances(ec2: Any, cluster: str, states: list[str]) -> list[dict[str, Any]]:
    result = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[cluster_filter(cluster), {"Name": "instance-state-name", "Values": states}],
        PaginationConfig={"PageSize": 200},
    )
    for page in pages:
        for reservation in page.get("Reservations", []):
            result.extend(reservation.get("Instances", []))
    return result


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


# ---------------------------------------------------------------- up


def _subnet(ec2: Any, subnet: str | None, region: str) -> dict[str, Any]:
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


def _resolve_ami(sess: Any, ami: str) -> str:
    """An AMI id as given, or the value of the SSM parameter named by `ami` (starts with /)."""
    if not ami.startswith("/"):
        return ami
    ssm = client(sess, "ssm")
    with aws_errors(sess.region_name, endpoint(ssm)):
        try:
            value = ssm.get_parameter(Name=ami).get("Parameter", {}).get("Value")
        except Exception as exc:
            if _error_code(exc) == "ParameterNotFound":
                raise DsclusterError(
                    f"SSM parameter {ami} does not exist in {sess.region_name}; check --ami"
                ) from exc
            raise
    if not isinstance(value, str) or not AMI_RE.fullmatch(value):
        raise DsclusterError(
            f"SSM parameter {ami} holds {str(value)[:60]!r}, not an AMI id; check --ami"
        )
    return value


def _ensure_placement_group(ec2: Any, cluster: str, result: UpResult, say: Say) -> bool:
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
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": _tags(cluster)}],
    )
    result.created.append(f"placement group {name}")
    say(f"created placement group {name} (strategy cluster)")
    return True


def _self_rule_present(permissions: list[dict[str, Any]], group_id: str) -> bool:
    return any(
        p.get("IpProtocol") == "-1"
        and any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))
        for p in permissions
    )


def _ensure_security_group(
    ec2: Any, cluster: str, vpc_id: str, *, ssh_cidr: str | None, result: UpResult, say: Say
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
                TagSpecifications=[{"ResourceType": "security-group", "Tags": _tags(cluster)}],
            )["GroupId"]
        )
        result.created.append(f"security group {name} ({group_id})")
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


def check_up_options(
    *,
    instance_type: str,
    count: int,
    subnet: str | None,
    ami: str | None,
    key_name: str | None,
    ssh_cidr: str | None,
    wait_s: int,
    allow_world_ssh: bool = False,
) -> None:
    """Every refusal `up` can make from its options alone, before any AWS call."""
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
        check_world_ssh(ssh_cidr, allow_world_ssh)
    if wait_s < 0:
        raise DsclusterError(f"--wait {wait_s} is negative; give seconds, e.g. 600")


@dataclasses.dataclass
class _Plan:
    """What `up` read before creating anything."""

    type_info: TypeInfo
    image_id: str
    existing: list[dict[str, Any]]
    missing: int
    root: list[dict[str, Any]]  # BlockDeviceMappings: the AMI's root device, encrypted
    # The AMI was made by `dscluster image bake` (its training user; "" if not): its nodes
    # clean it at first boot.
    baked: str = ""


@dataclasses.dataclass
class _Made:
    """What this run of `up` created, for the rollback."""

    placement_group: str | None = None
    security_group: str | None = None
    instances: list[str] = dataclasses.field(default_factory=list)

    def items(self) -> list[str]:
        found = [f"instance {i}" for i in self.instances]
        if self.security_group:
            found.append(f"security group {self.security_group}")
        if self.placement_group:
            found.append(f"placement group {self.placement_group}")
        return found


def _plan(
    sess: Any,
    ec2: Any,
    cluster: str,
    *,
    instance_type: str,
    count: int,
    efa: bool,
    ami: str,
    key_name: str | None,
) -> _Plan:
    region = str(sess.region_name)
    info, _ = instance_types(ec2, [instance_type])
    type_info = info[instance_type]
    if type_info.source == "unknown":
        raise DsclusterError(
            f"instance type {instance_type} does not exist in {region}; check --type"
        )
    if efa and not type_info.efa:
        raise DsclusterError(
            f"instance type {instance_type} does not support EFA; drop --efa or pick an "
            "EFA type (e.g. p4d.24xlarge, p5.48xlarge, trn1.32xlarge)"
        )
    image_id = _resolve_ami(sess, ami)
    found = ec2.describe_images(Filters=[{"Name": "image-id", "Values": [image_id]}])
    if not found.get("Images"):
        via = f" (from SSM parameter {ami})" if ami != image_id else ""
        raise DsclusterError(
            f"AMI {image_id}{via} does not exist in {region} or is not shared with this "
            "account; check --ami and --region"
        )
    if key_name:
        pairs = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [key_name]}])
        if not pairs.get("KeyPairs"):
            raise DsclusterError(
                f"key pair {key_name} does not exist in {region}; create or import it "
                "('aws ec2 import-key-pair') or check --key-name"
            )
    root = root_volume(found["Images"][0], image_id)
    existing = live_instances(ec2, cluster, LIVE_STATES)
    tags = {t.get("Key"): t.get("Value") for t in found["Images"][0].get("Tags") or []}
    baked = str(tags.get(BAKED_USER_TAG) or "ds") if BAKED_CLUSTER_TAG in tags else ""
    return _Plan(type_info, image_id, existing, count - len(existing), root, baked)


def up(  # noqa: PLR0913 - the aws up command's options, each a keyword
    sess: Any,
    cluster: str,
    *,
    instance_type: str,
    count: int,
    efa: bool = False,
    subnet: str | None = None,
    ami: str | None = None,
    key_name: str | None = None,
    ssh_cidr: str | None = None,
    wait_s: int = 600,
    allow_world_ssh: bool = False,
    say: Say = print,
) -> UpResult:
    """Create or reconcile the cluster; a second run with the same arguments creates nothing.

    Everything is checked (options locally, then type, AMI, key pair and subnet in EC2)
    before anything is created; when a later step fails, what this run created is removed
    again, or the error says what is left and that `aws down` removes it."""
    check_cluster_name(cluster)
    check_up_options(
        instance_type=instance_type,
        count=count,
        subnet=subnet,
        ami=ami,
        key_name=key_name,
        ssh_cidr=ssh_cidr,
        wait_s=wait_s,
        allow_world_ssh=allow_world_ssh,
    )
    assert ami is not None
    region = str(sess.region_name)
    ec2 = ec2_client(sess)
    url = endpoint(ec2)
    with aws_errors(region, url):
        plan = _plan(
            sess,
            ec2,
            cluster,
            instance_type=instance_type,
            count=count,
            efa=efa,
            ami=ami,
            key_name=key_name,
        )
        result = UpResult(
            cluster=cluster,
            region=region,
            instance_type=instance_type,
            placement_group=resource_name(cluster),
            security_group="",
            existing=[str(i["InstanceId"]) for i in plan.existing],
        )
        if plan.missing <= 0:
            # Nothing to start: report only, do not touch (or re-create) anything.
            if plan.missing < 0:
                say(
                    f"{len(plan.existing)} instances already run for cluster {cluster}, more "
                    f"than --count {count}; none is stopped (use 'dscluster aws down' to remove "
                    "all)"
                )
            return result
        sub = _subnet(ec2, subnet, region)
    made = _Made()
    try:
        with aws_errors(region, url):
            _create(
                ec2,
                cluster,
                plan,
                sub,
                efa=efa,
                key_name=key_name,
                ssh_cidr=ssh_cidr,
                wait_s=wait_s,
                made=made,
                result=result,
                say=say,
            )
    except Exception as exc:
        _undo(ec2, cluster, plan, made, exc, say)
        raise
    except BaseException:
        if made.items():
            say(
                f"interrupted: left {', '.join(made.items())}; 'dscluster aws down --cluster "
                f"{cluster}' removes them"
            )
        raise
    return result


def _ssh_permission(ssh_cidr: str) -> dict[str, Any]:
    import ipaddress  # noqa: PLC0415

    net = ipaddress.ip_network(ssh_cidr, strict=True)
    ranges: dict[str, Any] = (
        {"IpRanges": [{"CidrIp": str(net), "Description": "dscluster SSH"}]}
        if net.version == 4
        else {"Ipv6Ranges": [{"CidrIpv6": str(net), "Description": "dscluster SSH"}]}
    )
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}


def baked_user_data(user: str = "ds") -> str:
    """cloud-config for a node started from a baked AMI: docker/bake/clean.sh once per
    instance, in cloud-init's bootcmd (before its ssh module makes the host keys and installs
    the key pair): the cluster keys, known_hosts, munge key and Slurm configuration of the
    node the AMI was made from are gone before sshd first lets anyone in."""
    import base64  # noqa: PLC0415

    from .. import paths  # noqa: PLC0415

    script = (paths.docker_dir() / "bake" / "clean.sh").read_bytes()
    encoded = base64.b64encode(script).decode()
    command = f"echo {encoded} | base64 -d | sh -s -- {shlex.quote(user)} first-boot"
    return (
        "#cloud-config\n"
        "# dscluster: this AMI was made by `dscluster image bake`; clean it once per instance.\n"
        "bootcmd:\n"
        f"  - [cloud-init-per, instance, dscluster-baked-clean, sh, -c, {json.dumps(command)}]\n"
    )


def _create(  # noqa: PLR0913 - what up decided, each a keyword
    ec2: Any,
    cluster: str,
    plan: _Plan,
    sub: dict[str, Any],
    *,
    efa: bool,
    key_name: str | None,
    ssh_cidr: str | None,
    wait_s: int,
    made: _Made,
    result: UpResult,
    say: Say,
) -> None:
    instance_type = plan.type_info.name
    if _ensure_placement_group(ec2, cluster, result, say):
        made.placement_group = resource_name(cluster)
    group_id = _ensure_security_group(
        ec2, cluster, sub["VpcId"], ssh_cidr=ssh_cidr, result=result, say=say
    )
    if any(c.startswith("security group") for c in result.created):
        made.security_group = group_id
    result.security_group = group_id
    result.efa_interfaces = 1 if efa else 0
    if plan.type_info.efa and not efa:
        say(
            f"{instance_type} supports EFA but --efa was not given: plain ENI (TCP only); "
            "run 'dscluster aws down' and 'up --efa' for EFA"
        )
    elif efa:
        say(
            f"{instance_type}: one EFA interface per instance (the type allows "
            f"{plan.type_info.max_efa})"
        )
    params: dict[str, Any] = {
        "ImageId": plan.image_id,
        "InstanceType": instance_type,
        "MinCount": plan.missing,
        "MaxCount": plan.missing,
        "Placement": {"GroupName": resource_name(cluster)},
        "NetworkInterfaces": network_interfaces(sub["SubnetId"], group_id, efa),
        "MetadataOptions": METADATA_OPTIONS,
        "BlockDeviceMappings": plan.root,
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": _tags(cluster)}
            for kind in ("instance", "volume", "network-interface")
        ],
    }
    if key_name:
        params["KeyName"] = key_name
    if plan.baked:
        params["UserData"] = baked_user_data(plan.baked)
        say(f"AMI {plan.image_id} was baked by dscluster: each node cleans it at first boot")
    launched = list(ec2.run_instances(**params).get("Instances") or [])
    made.instances = [str(i["InstanceId"]) for i in launched]
    if len(launched) != plan.missing:
        raise DsclusterError(
            f"EC2 started {len(launched)} of {plan.missing} instances; run 'dscluster aws up' "
            "again later (capacity), or pick another --type or --subnet"
        )
    launched.sort(key=lambda i: int(i.get("AmiLaunchIndex") or 0))
    ids = [str(i["InstanceId"]) for i in launched]
    result.launched = ids
    result.created.extend(f"instance {i}" for i in ids)
    _name_instances(ec2, cluster, plan.existing, launched)
    say(f"started {len(ids)} {instance_type} instances in {sub['SubnetId']}: {', '.join(ids)}")
    if wait_s > 0:
        ec2.get_waiter("instance_running").wait(
            InstanceIds=ids,
            WaiterConfig={
                "Delay": WAITER_DELAY_S,
                "MaxAttempts": max(1, wait_s // WAITER_DELAY_S),
            },
        )
        say(f"{len(ids)} instances running")


def _undo(ec2: Any, cluster: str, plan: _Plan, made: _Made, exc: Exception, say: Say) -> None:
    """Remove what this run of `up` made, then raise one error saying what happened.

    Instances this run started are those it was told about and any live instance of the
    cluster that was not there before (a RunInstances answer lost on the way)."""
    region = str(ec2.meta.region_name)
    url = endpoint(ec2)
    before = {str(i["InstanceId"]) for i in plan.existing}
    try:
        with aws_errors(region, url):
            live = live_instances(ec2, cluster, NOT_GONE_STATES)
        made.instances = sorted(set(made.instances) | {str(i["InstanceId"]) for i in live} - before)
    except DsclusterError:
        pass
    items = made.items()
    if not items:
        return
    say(f"aws up failed; removing what this run made: {', '.join(items)}")
    left: list[str] = []
    problems: list[str] = []

    def attempt(what: list[str], step: Callable[[], None]) -> None:
        if left:  # an earlier step failed: what follows depends on it
            left.extend(what)
            return
        try:
            with aws_errors(region, url):
                step()
        except Exception as err:
            left.extend(what)
            problems.append(squeeze(err))

    if made.instances:
        attempt(
            [f"instance {i}" for i in made.instances],
            lambda: _terminate(ec2, made.instances, SG_DELETE_RETRY_S),
        )
    if made.security_group:
        group = made.security_group
        attempt([f"security group {group}"], lambda: _delete_security_group(ec2, group))
    if made.placement_group:
        name = made.placement_group
        attempt([f"placement group {name}"], lambda: _delete_placement_group(ec2, name))
    if not isinstance(exc, DsclusterError):
        say(_left_line(cluster, left) if left else "removed what this run made")
        return  # a bug: main reports it with its traceback saved
    if left:
        raise DsclusterError(
            f"{exc}; removing what this run made failed too ({problems[0]}): left "
            f"{', '.join(left)}; 'dscluster aws down --cluster {cluster}' removes them"
        ) from exc
    raise DsclusterError(f"{exc}; removed what this run made ({', '.join(items)})") from exc


def _left_line(cluster: str, left: list[str]) -> str:
    return f"left {', '.join(left)}; 'dscluster aws down --cluster {cluster}' removes them"


def _terminate(ec2: Any, ids: list[str], wait_s: int) -> None:
    for start in range(0, len(ids), 500):
        ec2.terminate_instances(InstanceIds=ids[start : start + 500])
    for start in range(0, len(ids), 200):
        ec2.get_waiter("instance_terminated").wait(
            InstanceIds=ids[start : start + 200],
            WaiterConfig={"Delay": WAITER_DELAY_S, "MaxAttempts": max(1, wait_s // WAITER_DELAY_S)},
        )


def _delete_placement_group(ec2: Any, name: str) -> None:
    ec2.delete_placement_group(GroupName=name)


def _name_instances(
    ec2: Any, cluster: str, existing: list[dict[str, Any]], launched: list[dict[str, Any]]
) -> None:
    """Name tags <cluster>-<n> on the new instances (lowest free n first); the head tag on the
    first one when no live instance of the cluster carries it."""
    used = {tag_value(i, "Name") for i in existing}
    has_head = any(tag_value(i, ROLE_TAG) == HEAD_ROLE for i in existing)
    n = 0
    for index, inst in enumerate(launched):
        while f"{cluster}-{n}" in used:
            n += 1
        name = f"{cluster}-{n}"
        used.add(name)
        tags = [{"Key": "Name", "Value": name}]
        if index == 0 and not has_head:
            tags.append({"Key": ROLE_TAG, "Value": HEAD_ROLE})
        ec2.create_tags(Resources=[inst["InstanceId"]], Tags=tags)


# ---------------------------------------------------------------- down


def down(sess: Any, cluster: str, *, wait_s: int = 600, say: Say = print) -> list[str]:
    """Terminate the cluster's instances, wait, delete its SG and placement group; nothing else.

    On a failure the error says what was removed so far; running `down` again finishes."""
    check_cluster_name(cluster)
    if wait_s < 0:
        raise DsclusterError(f"--wait {wait_s} is negative; give seconds, e.g. 600")
    region = str(sess.region_name)
    ec2 = ec2_client(sess)
    removed: list[str] = []
    try:
        with aws_errors(region, endpoint(ec2)):
            _down(ec2, cluster, wait_s=wait_s, removed=removed, say=say)
    except DsclusterError as exc:
        if not removed:
            raise
        raise DsclusterError(
            f"{exc} (removed so far: {', '.join(removed)}); run 'dscluster aws down --cluster "
            f"{cluster}' again once fixed"
        ) from exc
    return removed


def _down(ec2: Any, cluster: str, *, wait_s: int, removed: list[str], say: Say) -> None:
    instances = live_instances(ec2, cluster, NOT_GONE_STATES)
    ids = sorted(str(i["InstanceId"]) for i in instances)
    for start in range(0, len(ids), 500):
        ec2.terminate_instances(InstanceIds=ids[start : start + 500])
        removed.extend(f"instance {i}" for i in ids[start : start + 500])
    if ids:
        say(f"terminating {len(ids)} instances: {', '.join(ids)}")
        if wait_s > 0:
            for start in range(0, len(ids), 200):
                ec2.get_waiter("instance_terminated").wait(
                    InstanceIds=ids[start : start + 200],
                    WaiterConfig={
                        "Delay": WAITER_DELAY_S,
                        "MaxAttempts": max(1, wait_s // WAITER_DELAY_S),
                    },
                )
            say(f"{len(ids)} instances terminated")
    for group in find_security_groups(ec2, cluster, None):
        if tag_value(group, CLUSTER_TAG) != cluster:
            say(f"left security group {group['GroupId']}: not tagged {CLUSTER_TAG}={cluster}")
            continue
        _delete_security_group(ec2, str(group["GroupId"]))
        removed.append(f"security group {group['GroupId']}")
        say(f"deleted security group {resource_name(cluster)} ({group['GroupId']})")
    placement = find_placement_group(ec2, cluster)
    if placement and tag_value(placement, CLUSTER_TAG) == cluster:
        ec2.delete_placement_group(GroupName=resource_name(cluster))
        removed.append(f"placement group {resource_name(cluster)}")
        say(f"deleted placement group {resource_name(cluster)}")
    elif placement:
        say(f"left placement group {placement['GroupName']}: not tagged {CLUSTER_TAG}={cluster}")


def _delete_security_group(ec2: Any, group_id: str) -> None:
    deadline = time.monotonic() + SG_DELETE_RETRY_S
    while True:
        try:
            ec2.delete_security_group(GroupId=group_id)
            return
        except Exception as exc:
            if _error_code(exc) != "DependencyViolation" or time.monotonic() > deadline:
                raise
            time.sleep(WAITER_DELAY_S)
