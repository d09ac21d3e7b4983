"""`dscluster aws up/down`: an EC2 cluster for DeepSpeed, idempotent, removed exactly.

`up` makes (or reuses) a cluster placement group `dscluster-<name>`, a security group
`dscluster-<name>` in the subnet's VPC that lets the cluster talk to itself (config.py), and
starts only the instances missing from `--count` (IMDSv2 only, the AMI's root volume
encrypted; SSH from the whole internet only with `--allow-world-ssh`). Everything it makes
carries `dscluster:cluster=<name>` (the first head also `dscluster:role=head`); `down` finds
things by that tag and the `dscluster-<name>` names, and removes those and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...errors import DsclusterError
from ...text import squeeze
from ..names import check_cluster_name
from .config import (
    BAKED_CLUSTER_TAG,
    BAKED_USER_TAG,
    CLUSTER_TAG,
    HEAD_ROLE,
    METADATA_OPTIONS,
    ROLE_TAG,
    SG_DELETE_RETRY_S,
    Say,
    UpOptions,
    baked_user_data,
    check_key_pair,
    check_up_options,
    choose_subnet,
    delete_placement_group,
    delete_security_group,
    ensure_placement_group,
    ensure_security_group,
    find_placement_group,
    find_security_groups,
    network_interfaces,
    resolve_ami,
    resource_name,
    root_volume,
    tag_value,
    tags,
)
from .discover import LIVE_STATES, TypeInfo, instance_types, live_instances
from .session import WAITER_DELAY_S, aws_errors, ec2_client, endpoint

NOT_GONE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


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


def _plan(sess: Any, ec2: Any, cluster: str, opts: UpOptions) -> _Plan:
    instance_type, count, efa, key_name = opts.instance_type, opts.count, opts.efa, opts.key_name
    ami = opts.ami
    assert ami is not None
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
    image_id = resolve_ami(sess, ami)
    found = ec2.describe_images(Filters=[{"Name": "image-id", "Values": [image_id]}])
    if not found.get("Images"):
        via = f" (from SSM parameter {ami})" if ami != image_id else ""
        raise DsclusterError(
            f"AMI {image_id}{via} does not exist in {region} or is not shared with this "
            "account; check --ami and --region"
        )
    if key_name:
        check_key_pair(ec2, key_name, region)
    root = root_volume(found["Images"][0], image_id)
    existing = live_instances(ec2, cluster, LIVE_STATES)
    image_tags = {t.get("Key"): t.get("Value") for t in found["Images"][0].get("Tags") or []}
    baked = str(image_tags.get(BAKED_USER_TAG) or "ds") if BAKED_CLUSTER_TAG in image_tags else ""
    return _Plan(type_info, image_id, existing, count - len(existing), root, baked)


def up(sess: Any, cluster: str, *, say: Say = print, **options: Any) -> UpResult:
    """Create or reconcile the cluster; a second run with the same arguments creates nothing.

    Everything is checked (options locally, then type, AMI, key pair and subnet in EC2)
    before anything is created; when a later step fails, what this run created is removed
    again, or the error says what is left and that `aws down` removes it. `options`: the
    fields of config.UpOptions."""
    check_cluster_name(cluster)
    opts = UpOptions(**options)
    check_up_options(opts)
    region = str(sess.region_name)
    ec2 = ec2_client(sess)
    url = endpoint(ec2)
    with aws_errors(region, url):
        plan = _plan(sess, ec2, cluster, opts)
        result = UpResult(
            cluster=cluster,
            region=region,
            instance_type=opts.instance_type,
            placement_group=resource_name(cluster),
            security_group="",
            existing=[str(i["InstanceId"]) for i in plan.existing],
        )
        if plan.missing <= 0:
            # Nothing to start: report only, do not touch (or re-create) anything.
            if plan.missing < 0:
                say(
                    f"{len(plan.existing)} instances already run for cluster {cluster}, more "
                    f"than --count {opts.count}; none is stopped (use 'dscluster aws down' to "
                    "remove all)"
                )
            return result
        sub = choose_subnet(ec2, opts.subnet, region)
    made = _Made()
    try:
        with aws_errors(region, url):
            _create(ec2, cluster, plan, sub, opts, made=made, result=result, say=say)
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


def _create(
    ec2: Any,
    cluster: str,
    plan: _Plan,
    sub: dict[str, Any],
    opts: UpOptions,
    *,
    made: _Made,
    result: UpResult,
    say: Say,
) -> None:
    instance_type = plan.type_info.name
    efa, key_name, ssh_cidr, wait_s = opts.efa, opts.key_name, opts.ssh_cidr, opts.wait_s
    if ensure_placement_group(ec2, cluster, result.created, say):
        made.placement_group = resource_name(cluster)
    group_id = ensure_security_group(
        ec2, cluster, sub["VpcId"], ssh_cidr=ssh_cidr, created=result.created, say=say
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
            {"ResourceType": kind, "Tags": tags(cluster)}
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
        attempt([f"security group {group}"], lambda: delete_security_group(ec2, group))
    if made.placement_group:
        name = made.placement_group
        attempt([f"placement group {name}"], lambda: delete_placement_group(ec2, name))
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
        new_tags = [{"Key": "Name", "Value": name}]
        if index == 0 and not has_head:
            new_tags.append({"Key": ROLE_TAG, "Value": HEAD_ROLE})
        ec2.create_tags(Resources=[inst["InstanceId"]], Tags=new_tags)


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
        delete_security_group(ec2, str(group["GroupId"]))
        removed.append(f"security group {group['GroupId']}")
        say(f"deleted security group {resource_name(cluster)} ({group['GroupId']})")
    placement = find_placement_group(ec2, cluster)
    if placement and tag_value(placement, CLUSTER_TAG) == cluster:
        ec2.delete_placement_group(GroupName=resource_name(cluster))
        removed.append(f"placement group {resource_name(cluster)}")
        say(f"deleted placement group {resource_name(cluster)}")
    elif placement:
        say(f"left placement group {placement['GroupName']}: not tagged {CLUSTER_TAG}={cluster}")
