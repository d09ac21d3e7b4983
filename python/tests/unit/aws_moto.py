"""A moto EC2 server for the AWS tests, with what moto 5.2 lacks added on the server side.

moto's server answers EC2 over real HTTP, so dscluster's boto3 code runs unchanged against it
(`AWS_ENDPOINT_URL`). Two gaps are filled here, in the server, never in dscluster's code:

- moto has no placement groups at all (CreatePlacementGroup answers 500 "not implemented"):
  Create/Describe/DeletePlacementGroups are added with AWS's semantics (duplicate name ->
  InvalidPlacementGroup.Duplicate, unknown -> InvalidPlacementGroup.Unknown, tags, filters).
- moto's GetConsoleOutput is one fixed kernel log for every instance: here every instance's
  console shows cloud-init's SSH host key block with a key of its own (default_host_key), as
  AWS returns it a few minutes after first boot; console() sets what an instance's console
  shows instead (e.g. no keys yet).
- moto starts every instance 'running' at once: set_state() puts one into 'pending'.
- refuse() makes the server answer one action with an EC2 error (a step of `aws up` failing
  midway, a removal failing), until reset().
- moto runs no user data: an instance whose user data powers it off (`systemctl poweroff`,
  as `image bake`'s builder does once it has cleaned itself) is found stopped by the next
  DescribeInstances; the request log keeps, with each CreateImage, the state its instance
  was in then (`_InstanceState`).
- moto records every network interface as InterfaceType "interface", so what EFA request was
  made cannot be read back from DescribeInstances: the server keeps a log of every EC2 request
  it received (action + parameters), which the tests read (EFA interfaces, pagination).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response
from moto.ec2.utils import Base64EncodedString
from moto.server import ThreadedMotoServer

_lock = threading.Lock()
_ids = itertools.count(1)
PLACEMENT_GROUPS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
REQUESTS: list[tuple[str, dict[str, Any]]] = []
CONSOLE: dict[str, str] = {}
REFUSE: dict[str, tuple[str, str]] = {}
# Actions refuse() can fail (EC2Response method names).
# The region the AWS tests use (conftest.aws_env sets it as AWS_DEFAULT_REGION).
REGION = "us-east-1"

REFUSABLE = (
    "run_instances",
    "create_tags",
    "create_security_group",
    "authorize_security_group_ingress",
    "terminate_instances",
    "delete_security_group",
    "delete_placement_group",
    "deregister_image",
)


def reset() -> None:
    with _lock:
        PLACEMENT_GROUPS.clear()
        REQUESTS.clear()
        CONSOLE.clear()
        REFUSE.clear()


def refuse(action: str, code: str = "InsufficientInstanceCapacity", message: str = "") -> None:
    """Answer every later `action` (e.g. RunInstances) with this EC2 error."""
    with _lock:
        REFUSE[action] = (code, message or f"{action} refused by the test")


def allow() -> None:
    """Stop refusing (what refuse() set), keeping everything else."""
    with _lock:
        REFUSE.clear()


def _refusable(original: Any) -> Any:
    def method(self: EC2Response) -> Any:
        with _lock:
            refusal = REFUSE.get(self._get_action())
        if refusal:
            raise EC2ClientError(*refusal)
        return original(self)

    method.refusable = True  # type: ignore[attr-defined]
    return method


def requests(action: str) -> list[dict[str, Any]]:
    with _lock:
        return [params for name, params in REQUESTS if name == action]


def _groups(resp: EC2Response) -> dict[str, dict[str, Any]]:
    return PLACEMENT_GROUPS.setdefault((resp.current_account, resp.region), {})


def _create_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    strategy = self._get_param("Strategy")
    tags = self._parse_tag_specification().get("placement-group", {})
    with _lock:
        groups = _groups(self)
        if name in groups:
            raise EC2ClientError(
                "InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists."
            )
        group = {
            "GroupName": name,
            "State": "available",
            "Strategy": strategy,
            "GroupId": f"pg-{next(_ids):017x}",
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        }
        groups[name] = group
    return ActionResult({"PlacementGroup": group})


def _tag_in(tag: dict[str, str], key: str, values: list[str]) -> bool:
    return tag["Key"] == key and tag["Value"] in values


def _describe_placement_groups(self: EC2Response) -> ActionResult:
    names = self._get_param("GroupNames", [])
    filters = self._filters_from_querystring()
    with _lock:
        groups = list(_groups(self).values())
    for name in names:
        if name not in {g["GroupName"] for g in groups}:
            raise EC2ClientError(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
            )
    if names:
        groups = [g for g in groups if g["GroupName"] in names]
    for key, values in filters.items():
        if key == "group-name":
            groups = [g for g in groups if g["GroupName"] in values]
        elif key == "strategy":
            groups = [g for g in groups if g["Strategy"] in values]
        elif key.startswith("tag:"):
            tag = key[4:]
            groups = [g for g in groups if any(_tag_in(t, tag, values) for t in g["Tags"])]
        else:
            raise EC2ClientError("InvalidParameterValue", f"filter {key} is not supported here")
    return ActionResult({"PlacementGroups": groups})


def _delete_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    with _lock:
        if _groups(self).pop(name, None) is None:
            raise EC2ClientError(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
            )
    return ActionResult({})


def console(instance_id: str, text: str) -> None:
    with _lock:
        CONSOLE[instance_id] = text


def default_host_key(instance_id: str) -> str:
    """The ed25519 host key an instance's console shows unless console() says otherwise: a
    well-formed public key blob, one per instance id."""
    import base64  # noqa: PLC0415
    import hashlib  # noqa: PLC0415

    name = b"ssh-ed25519"
    blob = (
        len(name).to_bytes(4, "big") + name + (32).to_bytes(4, "big")
        + hashlib.sha256(instance_id.encode()).digest()
    )  # fmt: skip
    return f"ssh-ed25519 {base64.b64encode(blob).decode()}"


def _get_console_output(self: EC2Response) -> ActionResult:
    instance_id = self._get_param("InstanceId")
    with _lock:
        text = CONSOLE.get(instance_id)
    instance = self.ec2_backend.get_instance(instance_id)
    if text is None:
        text = (
            "[   13.000000] cloud-init[1040]: Cloud-init v. 24.1 running 'modules:final'\n"
            "-----BEGIN SSH HOST KEY KEYS-----\n"
            f"{default_host_key(instance_id)} root@{instance_id}\n"
            "-----END SSH HOST KEY KEYS-----\n"
        )
    return ActionResult(
        {
            "InstanceId": instance.id,
            "Timestamp": utcnow(),
            "Output": Base64EncodedString.from_raw_string(text),
        }
    )


_original_call_action = EC2Response.call_action


POWERS_OFF = "systemctl poweroff"


def _call_action(self: EC2Response) -> Any:
    action = self._get_action()
    params = dict(self.querystring)
    if action == "DescribeInstances":
        for instance in self.ec2_backend.all_instances():
            data = instance.user_data.decode() if instance.user_data else ""
            if instance.is_running() and POWERS_OFF in data:
                instance.stop()
    elif action == "CreateImage":
        wanted = set(params.get("InstanceId", []))
        found = [i for i in self.ec2_backend.all_instances() if i.id in wanted]
        params["_InstanceState"] = [i.state for i in found]
    with _lock:
        REQUESTS.append((action, params))
    return _original_call_action(self)


def set_state(instance_id: str, name: str, code: int, region: str = REGION) -> None:
    """Put an instance into a state moto never produces by itself (moto starts instances
    'running' at once): e.g. 'pending', as AWS reports for the first seconds."""
    from moto.core import DEFAULT_ACCOUNT_ID  # noqa: PLC0415
    from moto.ec2.models import ec2_backends  # noqa: PLC0415
    from moto.ec2.models.instances import InstanceState  # noqa: PLC0415

    instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
    instance._state = InstanceState(name, code)


def install() -> None:
    EC2Response.create_placement_group = _create_placement_group
    EC2Response.describe_placement_groups = _describe_placement_groups
    EC2Response.delete_placement_group = _delete_placement_group
    EC2Response.get_console_output = _get_console_output
    EC2Response.call_action = _call_action
    for name in REFUSABLE:
        original = getattr(EC2Response, name)
        if not getattr(original, "refusable", False):
            setattr(EC2Response, name, _refusable(original))


def start() -> tuple[ThreadedMotoServer, str]:
    install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"
