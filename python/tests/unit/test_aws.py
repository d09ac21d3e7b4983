"""AWS inventory and cluster commands against a moto EC2 server over real HTTP.

moto runs in server mode (tests/aws_moto.py) and dscluster reaches it only through
`AWS_ENDPOINT_URL`, exactly as it reaches AWS. Tests named `test_cli_*` drive
`python -m dscluster inventory aws` / `aws up|down` in a subprocess; the others call the
modules directly (and look at what the server received).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import boto3
import pytest
import yaml

from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.sources.aws import config as aws_config
from dscluster.sources.aws import discover, instance
from dscluster.sources.aws import session as aws_session

from .. import rolefiles
from . import aws_moto

REGION = aws_moto.REGION
TAG = aws_config.CLUSTER_TAG
AMI_X = "ami-0123456789abcdef0"  # well formed, unknown to moto


@pytest.fixture(autouse=True)
def _fresh_moto_account(aws_env: None) -> None:
    """Every test here on a fresh moto account (conftest.aws_env)."""


@pytest.fixture
def ec2() -> Any:
    return boto3.client("ec2", region_name=REGION)


def session() -> Any:
    return aws_session.session(None, REGION)


def image(ec2: Any, pattern: str) -> str:
    images = ec2.describe_images(Filters=[{"Name": "name", "Values": [pattern]}])["Images"]
    assert images, pattern
    return images[0]["ImageId"]


def launch(
    ec2: Any,
    itype: str,
    count: int = 1,
    *,
    cluster: str | None = "demo",
    ami: str | None = None,
    tags: dict[str, str] | None = None,
    key: str | None = "train",
) -> list[dict[str, Any]]:
    all_tags = dict(tags or {})
    if cluster:
        all_tags[TAG] = cluster
    params: dict[str, Any] = {
        "ImageId": ami or image(ec2, "ubuntu*"),
        "InstanceType": itype,
        "MinCount": count,
        "MaxCount": count,
    }
    if key:
        params["KeyName"] = key
    if all_tags:
        params["TagSpecifications"] = [
            {
                "ResourceType": "instance",
                "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()],
            }
        ]
    return ec2.run_instances(**params)["Instances"]


def dsc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dscluster", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], rc: int = 1) -> str:
    assert proc.returncode == rc, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dscluster") and ": error: " in lines[0], lines[0]
    return lines[0]


def no_files(out: pathlib.Path) -> None:
    assert not (out / "hosts.yml").exists()
    assert not (out / "hostfile").exists()


# ---------------------------------------------------------------- what moto/AWS report


def test_instance_types_from_describe_instance_types(ec2):
    sess = session()
    info, warnings = discover.instance_types(
        aws_session.ec2_client(sess),
        ["p4d.24xlarge", "g5.12xlarge", "c5.2xlarge", "trn1.32xlarge", "dl1.24xlarge", "zz9.huge"],
    )
    assert (info["p4d.24xlarge"].accelerator, info["p4d.24xlarge"].count) == ("cuda", 8)
    assert info["p4d.24xlarge"].efa and info["p4d.24xlarge"].max_efa == 4
    assert (info["g5.12xlarge"].accelerator, info["g5.12xlarge"].count) == ("cuda", 4)
    assert info["g5.12xlarge"].efa
    assert (info["c5.2xlarge"].accelerator, info["c5.2xlarge"].efa) == ("cpu", False)
    assert (info["trn1.32xlarge"].accelerator, info["trn1.32xlarge"].count) == ("neuron", 16)
    # moto does not know dl1.24xlarge; AWS reports no Gaudi count: the cited table answers.
    assert (info["dl1.24xlarge"].accelerator, info["dl1.24xlarge"].count) == ("hpu", 8)
    assert info["dl1.24xlarge"].source == "table"
    assert info["zz9.huge"].source == "unknown" and info["zz9.huge"].accelerator == "cpu"
    assert len(warnings) == 1 and "zz9.huge" in warnings[0]
    assert all("dl1" not in w for w in warnings)


def test_ami_family_and_user(ec2):
    sess = session()
    amis = discover.images(
        aws_session.ec2_client(sess),
        [image(ec2, "ubuntu*"), image(ec2, "amzn*"), image(ec2, "suse*"), "ami-00000000"],
    )
    families = {discover.ami_family(i) for i in amis.values()}
    assert families == {("ubuntu", "ubuntu"), ("amazon_linux", "ec2-user"), ("suse", "ec2-user")}
    assert discover.ami_family(None) == ("unknown", None)
    assert discover.ami_family({"Name": "debian-12-amd64-2024"}) == ("debian", "admin")
    assert discover.ami_family(
        {"Name": "Deep Learning AMI GPU PyTorch 2.3 (Amazon Linux 2023)"}
    ) == (
        "amazon_linux",
        "ec2-user",
    )
    assert discover.ami_family(
        {"Name": "RHEL-9.4.0_HVM", "PlatformDetails": "Red Hat Enterprise Linux"}
    ) == ("rhel", "ec2-user")
    assert discover.ami_family({"Name": "Rocky-9-EC2-Base"}) == ("rocky", "rocky")


# ---------------------------------------------------------------- discovery


def test_discovery_1000_instances_paginated(ec2, tmp_path):
    """1,050 running instances in 210 reservations (+ ignored ones): more than one page."""
    ubuntu = image(ec2, "ubuntu*")
    for i in range(210):
        launch(ec2, ("p4d.24xlarge", "g5.12xlarge", "c5.2xlarge")[i % 3], 5, ami=ubuntu)
    stopped = launch(ec2, "g5.12xlarge", 2, ami=ubuntu)
    ec2.stop_instances(InstanceIds=[i["InstanceId"] for i in stopped])
    gone = launch(ec2, "p4d.24xlarge", 2, ami=ubuntu)
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in gone])
    launch(ec2, "p4d.24xlarge", 3, cluster="other", ami=ubuntu)
    aws_moto.reset()  # count only discovery's requests

    # console_keys=False: 1,050 GetConsoleOutput calls would only slow this pagination test;
    # the console path has its own test below.
    result = discover.write_inventory(
        session(), "demo", out_dir=tmp_path / "inv", console_keys=False
    )
    calls = aws_moto.requests("DescribeInstances")
    assert len(calls) > 1, "describe_instances was not paginated"
    assert all(c.get("MaxResults") == [str(discover.INSTANCES_PAGE_SIZE)] for c in calls)
    assert sum("NextToken" in c for c in calls) == len(calls) - 1
    assert len(result.nodes) == 1050
    skipped = {i["InstanceId"] for i in stopped + gone}
    assert not skipped & {n.instance_id for n in result.nodes}
    lines = (tmp_path / "inv" / "hostfile").read_text().splitlines()
    assert len(lines) == 1050 and len(set(lines)) == 1050
    slots = [int(line.split("slots=")[1]) for line in lines]
    assert sorted(set(slots)) == [1, 4, 8]
    assert sum(slots) == 350 * (8 + 4 + 1) == result.total_slots


def test_the_efa_interfaces_attached_are_the_devices_doctor_expects(ec2):
    """A recorded DescribeInstances entry (moto's) with its interfaces set to the types EC2
    documents for EFA (efa: EFA with ENA; efa-only), as `aws up --efa` and multi-card
    launches attach them."""
    inst = launch(ec2, "p4d.24xlarge")[0]
    (nic,) = ec2.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0][
        "Instances"
    ][0]["NetworkInterfaces"]
    info = discover.TypeInfo("p4d.24xlarge", "cuda", 8, True, 4, "describe_instance_types")

    def expected(*types: str) -> int:
        nics = [dict(nic, InterfaceType=t) for t in types]
        node = discover.Node(
            "n", dict(inst, NetworkInterfaces=nics), info, "ubuntu", "ubuntu", None, "10.0.0.5", 8
        )
        return discover._host_vars(node)["dscluster_expected_efa"]

    assert expected(nic["InterfaceType"]) == expected("interface") == 0  # moto's, as recorded
    assert expected("efa") == 1
    assert expected("efa", "efa-only", "efa-only", "efa-only") == 4


def test_mixed_types_hosts_yml_and_hostfile(ec2, tmp_path):
    ubuntu, amzn = image(ec2, "ubuntu*"), image(ec2, "amzn*")
    head = launch(ec2, "p4d.24xlarge", ami=ubuntu, tags={"dscluster:role": "head"})[0]
    gpus = launch(ec2, "g5.12xlarge", 2, ami=ubuntu)
    cpu = launch(ec2, "c5.2xlarge", ami=amzn, tags={"Name": "cpu-box"}, key="other")[0]
    stopped = launch(ec2, "g5.12xlarge")[0]
    ec2.stop_instances(InstanceIds=[stopped["InstanceId"]])
    dead = launch(ec2, "p4d.24xlarge")[0]
    ec2.terminate_instances(InstanceIds=[dead["InstanceId"]])
    foreign = launch(ec2, "p4d.24xlarge", cluster="other")[0]

    out = tmp_path / "inv"
    result = discover.write_inventory(session(), "demo", out_dir=out, cpu_slots=2)
    inv = load(out)  # through ansible-inventory, as every later stage reads it
    head_name = f"ip-{head['PrivateIpAddress'].replace('.', '-')}"
    assert inv.head == head_name
    assert inv.hosts[0] == head_name and len(inv.hosts) == 4
    ids = {inv.var(h, "dscluster_instance_id") for h in inv.hosts}
    assert ids == {head["InstanceId"], cpu["InstanceId"]} | {g["InstanceId"] for g in gpus}
    assert not {stopped["InstanceId"], dead["InstanceId"], foreign["InstanceId"]} & ids
    by_type = {inv.var(h, "dscluster_instance_type"): h for h in inv.hosts}
    hv = inv.hostvars
    assert hv[head_name]["dscluster_expected_accelerator"] == "cuda"
    assert hv[head_name]["dscluster_expected_slots"] == 8
    assert hv[head_name]["dscluster_efa_supported"] is True
    assert hv[head_name]["ansible_host"] == head["PrivateIpAddress"]
    assert hv[head_name]["ansible_user"] == "ubuntu"
    assert hv[head_name]["ansible_ssh_private_key_file"] == "~/.ssh/train.pem"
    g5 = by_type["g5.12xlarge"]
    assert (hv[g5]["dscluster_expected_slots"], hv[g5]["dscluster_efa_supported"]) == (4, True)
    assert "cpu-box" in inv.hosts  # valid unique Name tag wins
    assert hv["cpu-box"]["dscluster_expected_accelerator"] == "cpu"
    assert hv["cpu-box"]["dscluster_expected_slots"] == 2  # --cpu-slots
    assert hv["cpu-box"]["dscluster_efa_supported"] is False
    assert hv["cpu-box"]["ansible_user"] == "ec2-user"
    assert hv["cpu-box"]["ansible_ssh_private_key_file"] == "~/.ssh/other.pem"
    assert set(inv.groups["aws_ami_ubuntu"]) == {head_name} | {
        f"ip-{g['PrivateIpAddress'].replace('.', '-')}" for g in gpus
    }
    assert inv.groups["aws_ami_amazon_linux"] == ["cpu-box"]
    assert hv[head_name]["dscluster_source"] == "aws"
    assert hv[head_name]["dscluster_aws_region"] == REGION
    common = hv[head_name]["ansible_ssh_common_args"]
    known = pathlib.Path(str(tmp_path / "cache" / "clusters" / "demo" / "known_hosts"))
    assert f"UserKnownHostsFile={known}" in common
    assert "StrictHostKeyChecking=yes" in common and "ConnectTimeout=15" in common
    assert "accept-new" not in (out / "hosts.yml").read_text()

    raw = yaml.safe_load((out / "hosts.yml").read_text())
    family = raw["all"]["children"]["aws_ami_ubuntu"]["vars"]
    assert family == {"ansible_user": "ubuntu", "ansible_ssh_private_key_file": "~/.ssh/train.pem"}
    hostfile = (out / "hostfile").read_text().splitlines()
    assert hostfile[0] == f"{head_name} slots=8"
    assert sorted(hostfile[1:]) == sorted(
        [f"{by_type['g5.12xlarge']} slots=4", "cpu-box slots=2"]
        + [
            f"ip-{g['PrivateIpAddress'].replace('.', '-')} slots=4"
            for g in gpus
            if f"ip-{g['PrivateIpAddress'].replace('.', '-')}" != by_type["g5.12xlarge"]
        ]
    )
    assert result.total_slots == 8 + 4 + 4 + 2


def test_head_by_lowest_launch_index(ec2, tmp_path):
    first = launch(ec2, "c5.2xlarge", 3)  # launch indexes 0, 1, 2
    ec2.terminate_instances(InstanceIds=[first[0]["InstanceId"]])
    later = launch(ec2, "c5.2xlarge", 2)  # a later reservation: indexes 0, 1
    nodes, _ = discover.discover(session(), "demo")
    assert nodes[0].instance_id == later[0]["InstanceId"]  # index 0 beats an earlier index 1
    assert len(nodes) == 4


def test_head_tiebreak_is_launch_time_then_id():
    t0 = "2026-01-01T00:00:00+00:00"
    t1 = "2026-01-01T00:01:00+00:00"
    insts = [
        {"InstanceId": "i-b", "AmiLaunchIndex": 0, "LaunchTime": t1},
        {"InstanceId": "i-c", "AmiLaunchIndex": 0, "LaunchTime": t0},
        {"InstanceId": "i-a", "AmiLaunchIndex": 1, "LaunchTime": t0},
    ]
    assert discover.choose_head(insts, ("dscluster:role", "head"))["InstanceId"] == "i-c"
    insts[0]["LaunchTime"] = t0
    assert discover.choose_head(insts, ("dscluster:role", "head"))["InstanceId"] == "i-b"
    insts[2]["Tags"] = [{"Key": "tier", "Value": "boss"}]
    assert discover.choose_head(insts, ("tier", "boss"))["InstanceId"] == "i-a"


def test_head_by_custom_tag_and_two_heads_refused(ec2, tmp_path):
    launch(ec2, "c5.2xlarge", 2)
    boss = launch(ec2, "c5.2xlarge", tags={"tier": "boss"})[0]
    nodes, _ = discover.discover(session(), "demo", head_tag=("tier", "boss"))
    assert nodes[0].instance_id == boss["InstanceId"]
    launch(ec2, "c5.2xlarge", tags={"tier": "boss"})
    with pytest.raises(DsclusterError, match="2 running instances carry the head tag tier=boss"):
        discover.discover(session(), "demo", head_tag=("tier", "boss"))


def test_duplicate_or_invalid_name_tags_fall_back_to_private_dns(ec2):
    twins = launch(ec2, "c5.2xlarge", 2, tags={"Name": "twin"})
    odd = launch(ec2, "c5.2xlarge", tags={"Name": "bad name!"})[0]
    nodes, _ = discover.discover(session(), "demo")
    names = {n.instance_id: n.name for n in nodes}
    for inst in [*twins, odd]:
        assert names[inst["InstanceId"]] == inst["PrivateDnsName"].split(".")[0]


def test_public_addresses_and_overrides(ec2, tmp_path):
    inst = launch(ec2, "c5.2xlarge")[0]
    key = tmp_path / "k.pem"
    nodes, _ = discover.discover(session(), "demo", public=True, user="alice", key_file=str(key))
    assert nodes[0].address == inst["PublicIpAddress"] != inst["PrivateIpAddress"]
    assert (nodes[0].user, nodes[0].key_file) == ("alice", str(key))


def test_unknown_ami_needs_user(ec2, tmp_path):
    launch(ec2, "c5.2xlarge", ami="ami-12c6146b")  # a Windows Server AMI in moto's list
    with pytest.raises(DsclusterError, match="run Windows"):
        discover.write_inventory(session(), "demo", out_dir=tmp_path)
    no_files(tmp_path)


# ---------------------------------------------------------------- host keys from the console


def host_key(tmp_path: pathlib.Path, kind: str, name: str) -> str:
    path = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@node", "-f", str(path)],
        check=True,
    )
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def cloud_init_console(*keys: str) -> str:
    """The tail of an EC2 console at first boot, as cloud-init prints it."""
    lines = [
        "[   12.345678] cloud-init[1040]: Cloud-init v. 24.1 running 'modules:final'",
        "<14>Nov 22 04:50:01 ec2: #############################################################",
        "<14>Nov 22 04:50:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
        "<14>Nov 22 04:50:01 ec2: 256 SHA256:AbCdEf root@node (ED25519)",
        "<14>Nov 22 04:50:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----",
        "-----BEGIN SSH HOST KEY KEYS-----",
        *(f"{k} root@node" for k in keys),
        "-----END SSH HOST KEY KEYS-----",
        "[   13.000000] cloud-init[1040]: Cloud-init v. 24.1 finished",
    ]
    return "\n".join(lines) + "\n"


def test_console_host_keys_parsed(tmp_path):
    ed = host_key(tmp_path, "ed25519", "ed")
    ecdsa = host_key(tmp_path, "ecdsa", "ec")
    text = cloud_init_console(ecdsa, ed)
    assert discover.console_host_keys(text) == (ecdsa, ed)
    assert discover.console_host_keys(text + text) == (ecdsa, ed)
    assert discover.console_host_keys("ssh-ed25519 AAAA outside any block\n") == ()
    broken = cloud_init_console("ssh-ed25519 not*base64")
    assert discover.console_host_keys(broken) == ()


def test_known_hosts_pinned_from_console(ec2, tmp_path):
    head = launch(ec2, "c5.2xlarge", tags={"Name": "head-0", "dscluster:role": "head"})[0]
    worker = launch(ec2, "c5.2xlarge", tags={"Name": "worker-1"})[0]
    ed = host_key(tmp_path, "ed25519", "ed")
    aws_moto.console(head["InstanceId"], cloud_init_console(ed))
    aws_moto.console(worker["InstanceId"], "[    1.0] Linux version 6.1 (booting)\n")
    known = tmp_path / "cache" / "clusters" / "demo" / "known_hosts"
    known.parent.mkdir(parents=True)
    stale = host_key(tmp_path, "ed25519", "old")
    before = f"{head['PrivateIpAddress']} {stale}\nelsewhere.example {stale}\n"
    known.write_text(before)

    # The worker's console shows no key yet and nothing pins it: refused, never trusted on
    # first use, and nothing written.
    with pytest.raises(DsclusterError) as exc:
        discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv")
    message = str(exc.value)
    assert f"{worker['InstanceId']} (worker-1)" in message and "head-0" not in message
    assert "wait and run 'dscluster inventory aws' again" in message and "\n" not in message
    assert known.read_text() == before
    no_files(tmp_path / "inv")

    # Its keys printed: both pinned, the stale line replaced, a line not ours kept.
    worker_key = host_key(tmp_path, "ed25519", "wk")
    aws_moto.console(worker["InstanceId"], cloud_init_console(worker_key))
    result = discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv")
    lines = known.read_text().splitlines()
    assert f"head-0,{head['PrivateIpAddress']} {ed}" in lines
    assert f"worker-1,{worker['PrivateIpAddress']} {worker_key}" in lines
    assert f"elsewhere.example {stale}" in lines  # not ours: kept
    assert not any(line.startswith(head["PrivateIpAddress"]) for line in lines)  # stale: gone
    assert not [w for w in result.warnings if "host key" in w]
    assert known.stat().st_mode & 0o777 == 0o600
    common = load(tmp_path / "inv").var("head-0", "ansible_ssh_common_args")
    assert "StrictHostKeyChecking=yes" in common and "accept-new" not in common

    # Later the console no longer shows the keys (it keeps only recent output): the pin from
    # the earlier run stands, and is what SSH checks.
    aws_moto.console(worker["InstanceId"], "[    1.0] Linux version 6.1 (rebooted)\n")
    discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv")
    assert f"worker-1,{worker['PrivateIpAddress']} {worker_key}" in known.read_text()


def test_no_console_keys_pins_nothing_and_says_so(ec2, tmp_path):
    """--no-console-keys: the user pins the keys; hosts that are not pinned are named, and
    SSH to them stays refused (StrictHostKeyChecking=yes), never trusted on first use."""
    head = launch(ec2, "c5.2xlarge", tags={"Name": "head-0", "dscluster:role": "head"})[0]
    launch(ec2, "c5.2xlarge", tags={"Name": "worker-1"})
    known = tmp_path / "cache" / "clusters" / "demo" / "known_hosts"
    known.parent.mkdir(parents=True)
    mine = host_key(tmp_path, "ed25519", "mine")
    known.write_text(f"{head['PrivateIpAddress']} {mine}\n")
    aws_moto.reset()
    result = discover.write_inventory(
        session(), "demo", out_dir=tmp_path / "inv", console_keys=False
    )
    assert aws_moto.requests("GetConsoleOutput") == []
    (warning,) = [w for w in result.warnings if "host key" in w]
    assert "worker-1" in warning and "head-0" not in warning
    assert "StrictHostKeyChecking=yes" in warning
    assert known.read_text() == f"{head['PrivateIpAddress']} {mine}\n"


# ---------------------------------------------------------------- errors


def test_pending_instances_stop_discovery_and_count_for_up(ec2, tmp_path):
    ami = image(ec2, "ubuntu*")
    ready = launch(ec2, "c5.2xlarge", ami=ami)[0]
    starting = launch(ec2, "c5.2xlarge", ami=ami)[0]
    aws_moto.set_state(starting["InstanceId"], "pending", 0)
    with pytest.raises(DsclusterError) as exc:
        discover.write_inventory(session(), "demo", out_dir=tmp_path)
    assert "1 instances of cluster demo" in str(exc.value) and "still pending" in str(exc.value)
    assert starting["InstanceId"] in str(exc.value)
    assert ready["InstanceId"] not in str(exc.value)
    no_files(tmp_path)
    aws_moto.reset()
    result = instance.up(session(), "demo", instance_type="c5.2xlarge", count=2, ami=ami, say=print)
    assert result.created == [] and aws_moto.requests("RunInstances") == []


def test_no_instances_names_tag_and_region(ec2, tmp_path):
    launch(ec2, "c5.2xlarge", cluster="other")
    with pytest.raises(DsclusterError) as exc:
        discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv")
    assert f"{TAG}=demo" in str(exc.value) and REGION in str(exc.value)
    assert not (tmp_path / "inv").exists()


def test_no_credentials_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(DsclusterError) as exc:
        discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv")
    assert "no usable AWS credentials" in str(exc.value) and "aws configure" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "inv").exists()


def test_unknown_profile_and_no_region(monkeypatch):
    with pytest.raises(DsclusterError, match="AWS profile 'nope' is not configured"):
        aws_session.session("nope", REGION)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(DsclusterError, match="no AWS region"):
        aws_session.session(None, None)


def test_client_error_names_the_code():
    sess = session()
    with (
        pytest.raises(DsclusterError, match=r"InvalidInstanceID\.(Malformed|NotFound)"),
        aws_session.aws_errors(REGION),
    ):
        aws_session.ec2_client(sess).describe_instances(InstanceIds=["i-0000000000"])


# ---------------------------------------------------------------- aws up / down


def sg_named(ec2: Any, name: str) -> list[dict[str, Any]]:
    return ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}])[
        "SecurityGroups"
    ]


def live(ec2: Any, cluster: str) -> list[dict[str, Any]]:
    return discover.live_instances(ec2, cluster, ["pending", "running"])


def test_up_twice_then_down_removes_exactly_what_up_made(ec2):
    ami = image(ec2, "ubuntu*")
    bystander = launch(ec2, "c5.2xlarge", cluster=None)[0]
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    other_sg = ec2.create_security_group(GroupName="keep-me", Description="x", VpcId=vpc)
    aws_moto.reset()  # the request log: from here on, only what dscluster sends

    lines: list[str] = []
    first = instance.up(
        session(), "demo", instance_type="g5.12xlarge", count=3, ami=ami, say=lines.append
    )
    assert len(first.launched) == 3 and len(first.created) == 5
    assert any("supports EFA but --efa was not given: plain ENI" in line for line in lines)
    instances = live(ec2, "demo")
    assert sorted(i["InstanceId"] for i in instances) == sorted(first.launched)
    heads = [i for i in instances if aws_config.tag_value(i, aws_config.ROLE_TAG) == "head"]
    assert len(heads) == 1 and heads[0]["AmiLaunchIndex"] == 0
    assert sorted(aws_config.tag_value(i, "Name") for i in instances) == [
        "demo-0",
        "demo-1",
        "demo-2",
    ]
    (sg,) = sg_named(ec2, "dscluster-demo")
    assert aws_config.tag_value(sg, TAG) == "demo"
    assert all(
        [g["GroupId"] for g in i["NetworkInterfaces"][0]["Groups"]] == [sg["GroupId"]]
        for i in instances
    )
    self_pair = {"GroupId": sg["GroupId"]}

    def has_self(perms: list[dict[str, Any]]) -> bool:
        return any(
            p["IpProtocol"] == "-1"
            and any(self_pair.items() <= pair.items() for pair in p["UserIdGroupPairs"])
            for p in perms
        )

    assert has_self(sg["IpPermissions"]) and has_self(sg["IpPermissionsEgress"])
    pgs = ec2.describe_placement_groups(GroupNames=["dscluster-demo"])["PlacementGroups"]
    assert pgs[0]["Strategy"] == "cluster" and aws_config.tag_value(pgs[0], TAG) == "demo"
    (run,) = aws_moto.requests("RunInstances")
    assert run["Placement.GroupName"] == ["dscluster-demo"]
    assert "NetworkInterface.1.InterfaceType" not in run
    assert {run[f"TagSpecification.{n}.ResourceType"][0] for n in (1, 2, 3)} == {
        "instance",
        "volume",
        "network-interface",
    }

    second = instance.up(
        session(), "demo", instance_type="g5.12xlarge", count=3, ami=ami, say=lines.append
    )
    assert second.created == [] and len(second.existing) == 3
    assert len(aws_moto.requests("RunInstances")) == 1
    assert len(aws_moto.requests("CreateSecurityGroup")) == 1
    assert len(aws_moto.requests("CreatePlacementGroup")) == 1
    assert "nothing to create" in second.summary()

    # one instance lost: up starts exactly one, keeps the head, reuses SG and PG
    ec2.terminate_instances(InstanceIds=[first.launched[1]])
    third = instance.up(
        session(), "demo", instance_type="g5.12xlarge", count=3, ami=ami, say=lines.append
    )
    assert len(third.launched) == 1 and third.created == [f"instance {third.launched[0]}"]
    now = live(ec2, "demo")
    assert len(now) == 3
    assert sum(aws_config.tag_value(i, aws_config.ROLE_TAG) == "head" for i in now) == 1
    assert sorted(aws_config.tag_value(i, "Name") for i in now) == ["demo-0", "demo-1", "demo-2"]

    removed = instance.down(session(), "demo", say=lines.append)
    assert len(removed) == 3 + 2
    assert live(ec2, "demo") == []
    assert sg_named(ec2, "dscluster-demo") == []
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    assert sg_named(ec2, "keep-me")[0]["GroupId"] == other_sg["GroupId"]
    state = ec2.describe_instances(InstanceIds=[bystander["InstanceId"]])
    assert state["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"
    assert instance.down(session(), "demo", say=lines.append) == []  # down twice: no-op


def test_efa_interfaces_on_efa_types_only(ec2):
    ami = image(ec2, "ubuntu*")
    lines: list[str] = []
    with pytest.raises(DsclusterError, match=r"instance type c5\.2xlarge does not support EFA"):
        instance.up(
            session(),
            "cpu",
            instance_type="c5.2xlarge",
            count=2,
            efa=True,
            ami=ami,
            say=lines.append,
        )
    assert aws_moto.requests("RunInstances") == []
    assert aws_moto.requests("CreateSecurityGroup") == []
    assert aws_moto.requests("CreatePlacementGroup") == []

    instance.up(
        session(),
        "gpu",
        instance_type="p4d.24xlarge",
        count=2,
        efa=True,
        ami=ami,
        say=lines.append,
    )
    instance.up(session(), "cpu", instance_type="c5.2xlarge", count=2, ami=ami, say=print)
    efa_run, cpu_run = aws_moto.requests("RunInstances")
    assert efa_run["InstanceType"] == ["p4d.24xlarge"]
    assert efa_run["NetworkInterface.1.InterfaceType"] == ["efa"]
    assert efa_run["NetworkInterface.1.DeviceIndex"] == ["0"]
    (gpu_sg,) = sg_named(ec2, "dscluster-gpu")
    assert efa_run["NetworkInterface.1.SecurityGroupId.1"] == [gpu_sg["GroupId"]]
    assert cpu_run["InstanceType"] == ["c5.2xlarge"]
    assert "NetworkInterface.1.InterfaceType" not in cpu_run
    assert len(live(ec2, "gpu")) == 2 and len(live(ec2, "cpu")) == 2


def test_up_needs_an_ami_and_a_known_type(ec2):
    with pytest.raises(DsclusterError, match="no AMI: pass --ami"):
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, say=print)
    with pytest.raises(DsclusterError, match=r"instance type zz9\.huge does not exist"):
        instance.up(session(), "demo", instance_type="zz9.huge", count=1, ami=AMI_X, say=print)
    assert aws_moto.requests("CreateSecurityGroup") == []


def test_up_resolves_ami_from_ssm_parameter(ec2):
    param = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    expected = boto3.client("ssm", region_name=REGION).get_parameter(Name=param)
    result = instance.up(
        session(), "demo", instance_type="c5.2xlarge", count=1, ami=param, say=print
    )
    (inst,) = live(ec2, "demo")
    assert inst["ImageId"] == expected["Parameter"]["Value"]
    assert result.launched == [inst["InstanceId"]]


def test_foreign_security_group_with_our_name_is_not_taken(ec2):
    vpc = next(v for v in ec2.describe_vpcs()["Vpcs"] if v.get("IsDefault"))["VpcId"]
    ec2.create_security_group(GroupName="dscluster-demo", Description="not ours", VpcId=vpc)
    with pytest.raises(DsclusterError, match="not tagged dscluster:cluster=demo"):
        instance.up(
            session(),
            "demo",
            instance_type="c5.2xlarge",
            count=1,
            ami=image(ec2, "ubuntu*"),
            say=print,
        )
    assert aws_moto.requests("RunInstances") == []
    instance.down(session(), "demo", say=print)
    assert len(sg_named(ec2, "dscluster-demo")) == 1  # down leaves what it did not make


# ---------------------------------------------------------------- CLI (needs cli.py wiring)


def test_cli_inventory_aws_writes_hosts_and_hostfile(ec2, tmp_path):
    launch(ec2, "p4d.24xlarge", tags={"dscluster:role": "head", "Name": "head-0"})
    launch(ec2, "g5.12xlarge", tags={"Name": "gpu-1"})
    launch(ec2, "c5.2xlarge", tags={"Name": "cpu-2"})
    out = tmp_path / "inv"
    proc = dsc("inventory", "aws", "--cluster", "demo", "--region", REGION, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = (out / "hostfile").read_text().splitlines()
    assert lines[0] == "head-0 slots=8"  # head first, then launch order (same second here)
    assert sorted(lines[1:]) == ["cpu-2 slots=1", "gpu-1 slots=4"]
    assert "13 slots" in proc.stdout and str(out / "hosts.yml") in proc.stdout
    inv = load(out)
    assert inv.head == "head-0" and sorted(inv.groups["workers"]) == ["cpu-2", "gpu-1"]


def test_cli_no_instances_one_line(tmp_path):
    out = tmp_path / "inv"
    line = one_line_error(
        dsc("inventory", "aws", "--cluster", "ghost", "--region", "eu-west-1", "--out", str(out))
    )
    assert f"{TAG}=ghost" in line and "eu-west-1" in line
    assert not out.exists()


def test_cli_no_credentials_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    out = tmp_path / "inv"
    line = one_line_error(dsc("inventory", "aws", "--cluster", "demo", "--out", str(out)))
    assert "no usable AWS credentials" in line and "aws configure" in line
    assert not out.exists()


def test_cli_aws_up_twice_and_down(ec2):
    ami = image(ec2, "ubuntu*")
    args = ["--cluster", "demo", "--type", "p4d.24xlarge", "--count", "2", "--ami", ami]
    first = dsc("aws", "up", *args, "--efa")
    assert first.returncode == 0, first.stderr
    assert "created 4 objects (2 instances)" in first.stdout
    second = dsc("aws", "up", *args, "--efa")
    assert second.returncode == 0, second.stderr
    assert "nothing to create" in second.stdout
    assert len(aws_moto.requests("RunInstances")) == 1
    line = one_line_error(
        dsc("aws", "up", *args[:2], "--type", "c5.2xlarge", "--count", "1", "--ami", ami, "--efa")
    )
    assert "c5.2xlarge does not support EFA" in line
    no_ami = one_line_error(
        dsc("aws", "up", "--cluster", "x", "--type", "c5.2xlarge", "--count", "1"), rc=2
    )
    assert "--ami" in no_ami
    down = dsc("aws", "down", "--cluster", "demo")
    assert down.returncode == 0, down.stderr
    assert "removed 4 objects" in down.stdout
    assert live(ec2, "demo") == [] and sg_named(ec2, "dscluster-demo") == []


def test_make_provision_aws_writes_inventory_and_hostfile_then_stops_at_ssh(ec2, tmp_path):
    """The acceptance: `make provision INV=aws` against tagged (moto) instances writes
    hosts.yml and a hostfile with per-type slots, then stops at the SSH step with one clear
    line naming the hosts (moto's instances are not machines), never a traceback."""
    launch(ec2, "g5.12xlarge", tags={"dscluster:role": "head", "Name": "acc-head"})
    launch(ec2, "c5.2xlarge", tags={"Name": "acc-cpu"})
    inventories = tmp_path / "inventories"
    repo = rolefiles.REPO
    proc = subprocess.run(
        ["make", "--no-print-directory", "-C", str(repo), "provision", "INV=aws",
         "CLUSTER=demo", f"INVENTORIES={inventories}", "AWS_ARGS=--no-console-keys"],
        capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode != 0
    out = inventories / "aws"
    assert (out / "hostfile").read_text().splitlines() == ["acc-head slots=4", "acc-cpu slots=1"]
    inv = load(out)
    assert inv.var("acc-head", "dscluster_instance_type") == "g5.12xlarge"
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("dscluster: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "acc-head" in errors[0] and "acc-cpu" in errors[0]
    assert "ssh" in errors[0].lower(), errors[0]
    assert not (out / ".deepspeed_env").exists()  # stopped before launch files and smoke


# ---------------------------------------------------------------- aws up fails midway


def nothing_of(ec2: Any, cluster: str) -> None:
    """Nothing of the cluster is left in moto: no live instance, no SG, no placement group."""
    assert live(ec2, cluster) == []
    assert sg_named(ec2, f"dscluster-{cluster}") == []
    names = [g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]]
    assert f"dscluster-{cluster}" not in names


def test_up_failing_at_run_instances_removes_the_groups_it_made(ec2):
    ami = image(ec2, "ubuntu*")
    aws_moto.refuse("RunInstances", "InsufficientInstanceCapacity", "no p4d capacity")
    lines: list[str] = []
    with pytest.raises(DsclusterError) as exc:
        instance.up(
            session(), "demo", instance_type="p4d.24xlarge", count=2, efa=True, ami=ami,
            ssh_cidr="203.0.113.0/24", say=lines.append,
        )  # fmt: skip
    message = str(exc.value)
    assert "InsufficientInstanceCapacity" in message and "RunInstances" in message
    assert "removed what this run made" in message and "placement group dscluster-demo" in message
    assert "\n" not in message
    assert aws_moto.requests("CreateSecurityGroup") and aws_moto.requests("CreatePlacementGroup")
    nothing_of(ec2, "demo")


def test_up_failing_after_launch_terminates_its_instances(ec2):
    ami = image(ec2, "ubuntu*")
    aws_moto.refuse("CreateTags", "RequestLimitExceeded", "slow down")
    with pytest.raises(DsclusterError, match="removed what this run made") as exc:
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=3, ami=ami, say=print)
    (run,) = aws_moto.requests("RunInstances")
    assert run["MinCount"] == ["3"]
    assert str(exc.value).count("instance i-") == 3
    nothing_of(ec2, "demo")


def test_up_keeps_what_an_earlier_run_made(ec2):
    ami = image(ec2, "ubuntu*")
    first = instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami, say=print)
    aws_moto.refuse("RunInstances")
    with pytest.raises(DsclusterError) as exc:
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=3, ami=ami, say=print)
    assert "InsufficientInstanceCapacity" in str(exc.value)
    assert "removed what this run made" not in str(exc.value)  # it made nothing
    assert [i["InstanceId"] for i in live(ec2, "demo")] == first.launched
    assert len(sg_named(ec2, "dscluster-demo")) == 1
    assert ec2.describe_placement_groups(GroupNames=["dscluster-demo"])["PlacementGroups"]


def test_up_says_what_is_left_when_removing_fails_too(ec2):
    ami = image(ec2, "ubuntu*")
    aws_moto.refuse("RunInstances")
    aws_moto.refuse("DeletePlacementGroup", "UnauthorizedOperation", "not allowed")
    with pytest.raises(DsclusterError) as exc:
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami, say=print)
    message = str(exc.value)
    assert "left placement group dscluster-demo" in message
    assert "'dscluster aws down --cluster demo' removes them" in message
    assert "security group" not in message.split("left", 1)[1]  # the SG was removed
    assert sg_named(ec2, "dscluster-demo") == []
    aws_moto.allow()
    assert instance.down(session(), "demo", say=print) == ["placement group dscluster-demo"]
    nothing_of(ec2, "demo")


def test_up_refuses_unknown_ami_key_pair_and_bad_options_before_creating(ec2):
    with pytest.raises(DsclusterError, match=f"AMI {AMI_X} does not exist in {REGION}"):
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, ami=AMI_X)
    ami = image(ec2, "ubuntu*")
    with pytest.raises(DsclusterError, match="key pair nokey does not exist"):
        instance.up(
            session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami, key_name="nokey"
        )
    for bad in ({"ssh_cidr": "10.0.0.1/8"}, {"subnet": "sub-1"}, {"count": 0}):
        params: dict[str, Any] = {"instance_type": "c5.2xlarge", "count": 1, "ami": ami, **bad}
        with pytest.raises(DsclusterError):
            instance.up(session(), "demo", **params)
    assert aws_moto.requests("CreateSecurityGroup") == []
    assert aws_moto.requests("CreatePlacementGroup") == []


def test_up_ssh_from_an_ipv6_network(ec2):
    ami = image(ec2, "ubuntu*")
    instance.up(
        session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami,
        ssh_cidr="2001:db8::/32", say=print,
    )  # fmt: skip
    (sg,) = sg_named(ec2, "dscluster-demo")
    ssh = [p for p in sg["IpPermissions"] if p.get("FromPort") == 22]
    assert ssh and ssh[0]["Ipv6Ranges"][0]["CidrIpv6"] == "2001:db8::/32"


def test_up_requires_imdsv2_and_encrypts_the_root_volume(ec2):
    """What moto reports of the instances `up` started: IMDSv2 only (tokens required, hop
    limit 1), and the AMI's root device an encrypted EBS volume, removed with the instance."""
    ami = image(ec2, "ubuntu*")
    (root_device,) = {i["RootDeviceName"] for i in ec2.describe_images(ImageIds=[ami])["Images"]}
    result = instance.up(session(), "demo", instance_type="c5.2xlarge", count=2, ami=ami, say=print)
    instances = live(ec2, "demo")
    assert sorted(i["InstanceId"] for i in instances) == sorted(result.launched)
    for inst in instances:
        options = inst["MetadataOptions"]
        assert options["HttpTokens"] == "required" and options["HttpEndpoint"] == "enabled"
        assert options["HttpPutResponseHopLimit"] == 1
        assert inst["RootDeviceName"] == root_device
        (mapping,) = [m for m in inst["BlockDeviceMappings"] if m["DeviceName"] == root_device]
        (volume,) = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"]
        assert volume["Encrypted"] is True
        assert mapping["Ebs"]["DeleteOnTermination"] is True
    (run,) = aws_moto.requests("RunInstances")
    assert run["BlockDeviceMapping.1.DeviceName"] == [root_device]
    assert run["BlockDeviceMapping.1.Ebs.Encrypted"] == ["true"]
    # moto's defaults are HttpTokens optional and hop limit 1: the request says both itself
    assert run["MetadataOptions.HttpTokens"] == ["required"]
    assert run["MetadataOptions.HttpPutResponseHopLimit"] == ["1"]


def test_up_refuses_an_instance_store_ami_before_creating(ec2, monkeypatch):
    ami = image(ec2, "ubuntu*")
    real = aws_config.root_volume
    store = {"RootDeviceType": "instance-store"}
    monkeypatch.setattr(instance, "root_volume", lambda img, iid: real({**img, **store}, iid))
    with pytest.raises(DsclusterError, match=f"AMI {ami} has no EBS root device"):
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami)
    assert aws_moto.requests("CreateSecurityGroup") == []
    assert aws_moto.requests("RunInstances") == []


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_up_refuses_world_open_ssh_unless_asked_by_name(ec2, cidr):
    ami = image(ec2, "ubuntu*")
    aws_moto.reset()
    with pytest.raises(DsclusterError) as exc:
        instance.up(session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami, ssh_cidr=cidr)
    assert f"--ssh-cidr {cidr} opens SSH to the whole internet" in str(exc.value)
    assert "--allow-world-ssh" in str(exc.value)
    assert aws_moto.requests("DescribeInstanceTypes") == []  # refused before any AWS call
    line = one_line_error(
        dsc("aws", "up", "--cluster", "demo", "--type", "c5.2xlarge", "--count", "1",
            "--ami", ami, "--ssh-cidr", cidr),
        rc=2,
    )  # fmt: skip
    assert cidr in line and "--allow-world-ssh" in line
    assert aws_moto.requests("DescribeInstanceTypes") == []
    nothing_of(ec2, "demo")
    # asked for by name: the rule is made
    instance.up(
        session(), "demo", instance_type="c5.2xlarge", count=1, ami=ami, ssh_cidr=cidr,
        allow_world_ssh=True, say=print,
    )  # fmt: skip
    (sg,) = sg_named(ec2, "dscluster-demo")
    ssh = [p for p in sg["IpPermissions"] if p.get("FromPort") == 22]
    found = ssh[0]["IpRanges"] + ssh[0]["Ipv6Ranges"]
    ranges = [r.get("CidrIp") or r.get("CidrIpv6") for r in found]
    assert ranges == [cidr]


# ---------------------------------------------------------------- endpoints that are not EC2


class _Answer:
    """An HTTP endpoint that answers every request with one fixed status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        import http.server  # noqa: PLC0415
        import threading  # noqa: PLC0415

        outer = self
        self.calls = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.calls += 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # poll 10 ms: close()'s shutdown() waits for the next poll (0.5 s by default)
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b"<html><body>captive portal</body></html>", "not an EC2 response"),
        (200, b'<?xml version="1.0"?><Other><Thing>1</Thing></Other>', "not an EC2 response"),
        (200, b"{not xml", "not an EC2 response"),
        (500, b"<Error><Code>InternalError</Code><Message>x</Message></Error>", "HTTP 500"),
        (503, b"down for maintenance", "not an EC2 response"),
        (403, b"<html>forbidden</html>", "HTTP 403 and no EC2 error"),
    ],
    ids=["html", "other-xml", "garbage", "500", "503-text", "403-html"],
)
def test_cli_down_and_inventory_against_a_non_ec2_endpoint(
    monkeypatch, tmp_path, status, body, expected
):
    answer = _Answer(status, body)
    monkeypatch.setenv("AWS_ENDPOINT_URL", answer.url)
    try:
        down = one_line_error(dsc("aws", "down", "--cluster", "demo", "--wait", "5"))
        inv = one_line_error(
            dsc("inventory", "aws", "--cluster", "demo", "--out", str(tmp_path / "inv"))
        )
    finally:
        answer.close()
    for line in (down, inv):
        assert expected in line and answer.url in line, line
        assert "AWS_ENDPOINT_URL" in line
    assert "removed so far" not in down
    assert not (tmp_path / "inv").exists()


def test_cli_bad_endpoint_url_refused_before_any_request(monkeypatch):
    for url in ("not a url", "ftp://example.com", "http://", "localhost:4566"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        line = one_line_error(dsc("aws", "down", "--cluster", "demo"), rc=2)
        assert repr(url) in line and "http(s) URL" in line
    assert aws_moto.requests("DescribeInstances") == []


def test_cli_up_bad_ssh_cidr_creates_nothing(ec2):
    ami = image(ec2, "ubuntu*")
    line = one_line_error(
        dsc("aws", "up", "--cluster", "demo", "--type", "c5.2xlarge", "--count", "1",
            "--ami", ami, "--ssh-cidr", "10.0.0.1/8"),
        rc=2,
    )  # fmt: skip
    assert "10.0.0.1/8" in line and "host bits" in line
    assert aws_moto.requests("DescribeInstanceTypes") == []
    nothing_of(ec2, "demo")


def test_non_utf8_known_hosts_is_one_line(ec2, tmp_path):
    launch(ec2, "c5.2xlarge")
    known = tmp_path / "cache" / "clusters" / "demo" / "known_hosts"
    known.parent.mkdir(parents=True)
    known.write_bytes(b"host ssh-ed25519 AAAA\xff\n")
    with pytest.raises(DsclusterError, match="is not UTF-8 text"):
        discover.write_inventory(session(), "demo", out_dir=tmp_path / "inv", console_keys=False)
    no_files(tmp_path / "inv")
    assert known.read_bytes() == b"host ssh-ed25519 AAAA\xff\n"


def test_down_failing_midway_says_what_it_removed(ec2):
    ami = image(ec2, "ubuntu*")
    first = instance.up(session(), "demo", instance_type="c5.2xlarge", count=2, ami=ami, say=print)
    aws_moto.refuse("DeleteSecurityGroup", "UnauthorizedOperation", "not allowed")
    with pytest.raises(DsclusterError) as exc:
        instance.down(session(), "demo", say=print)
    message = str(exc.value)
    assert "UnauthorizedOperation" in message and "DeleteSecurityGroup" in message
    assert all(f"instance {i}" in message for i in first.launched)
    assert "run 'dscluster aws down --cluster demo' again" in message
    aws_moto.allow()
    removed = instance.down(session(), "demo", say=print)
    assert len(removed) == 2  # the security group and the placement group
    nothing_of(ec2, "demo")
