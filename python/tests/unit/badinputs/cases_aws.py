"""Bad inputs to `aws up`, `aws down` and `inventory aws`: every one refused before any AWS
request (the harness's endpoint records any), with one line naming the value and the fix."""

from __future__ import annotations

from .harness import Case

AMI = "ami-0123456789abcdef0"
UP = ["aws", "up", "--cluster", "demo", "--type", "c5.2xlarge", "--count", "2", "--ami", AMI]
DOWN = ["aws", "down", "--cluster", "demo"]
INV = ["inventory", "aws", "--cluster", "demo"]
# No AWS configuration of the machine running the tests leaks in (profiles, regions).
NO_CONFIG = {
    "AWS_CONFIG_FILE": "/nonexistent/dscluster-test/config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/dscluster-test/credentials",
}


def up(**options: str) -> list[str]:
    """`aws up` with the base options, some replaced (key: option name without --)."""
    argv = list(UP)
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


CASES = [
    # ---------------------------------------------------------------- aws up: options
    Case("aws-up-count-zero", up(count="0"), "'0'", "from 1 to 16384"),
    Case("aws-up-count-negative", up(count="-5"), "'-5'", "from 1 to 16384"),
    Case("aws-up-count-huge", up(count="99999"), "'99999'", "from 1 to 16384"),
    Case("aws-up-count-word", up(count="two"), "'two'", "whole number"),
    Case("aws-up-count-float", up(count="2.5"), "'2.5'", "whole number"),
    Case("aws-up-wait-zero", up(wait="0"), "'0'", "from 1"),
    Case("aws-up-wait-word", up(wait="10m"), "'10m'", "whole number"),
    Case("aws-up-type-no-size", up(type="p4d"), "'p4d'", "family.size"),
    Case("aws-up-type-newline", up(type="c5.large\n"), "c5.large\\n", "p4d.24xlarge"),
    Case("aws-up-type-upper", up(type="P4D.24XLARGE"), "P4D.24XLARGE", "family.size"),
    Case("aws-up-type-space", up(type="c5 .large"), "c5 .large", "family.size"),
    Case("aws-up-cidr-host-bits", up(ssh_cidr="10.0.0.1/8"), "10.0.0.1/8", "no host bits"),
    Case("aws-up-cidr-no-prefix", up(ssh_cidr="10.0.0.1"), "10.0.0.1", "address/prefix"),
    Case("aws-up-cidr-word", up(ssh_cidr="anywhere"), "anywhere", "203.0.113.7/32"),
    Case("aws-up-cidr-prefix-33", up(ssh_cidr="10.0.0.0/33"), "10.0.0.0/33", "address/prefix"),
    # SSH open to the whole internet needs --allow-world-ssh by name
    Case("aws-up-cidr-world", up(ssh_cidr="0.0.0.0/0"), "0.0.0.0/0", "--allow-world-ssh"),
    Case("aws-up-cidr-world-v6", up(ssh_cidr="::/0"), "::/0", "--allow-world-ssh"),
    Case("aws-up-subnet-shape", up(subnet="sub-123"), "sub-123", "subnet-0123456789abcdef0"),
    Case("aws-up-subnet-upper", up(subnet="subnet-ABCDEF12"), "subnet-ABCDEF12", "subnet-0123"),
    Case(
        "aws-up-no-ami",
        ["aws", "up", "--cluster", "demo", "--type", "c5.2xlarge", "--count", "2"],
        "--ami",
        "describe-images",
    ),
    Case("aws-up-ami-name", up(ami="ubuntu-22.04"), "ubuntu-22.04", "ami-0123456789abcdef0"),
    Case("aws-up-ami-short", up(ami="ami-1"), "ami-1", "starting with '/'"),
    Case("aws-up-ami-ssm-space", up(ami="/aws/my param"), "/aws/my param", "starting with '/'"),
    Case("aws-up-key-name-pem", up(key_name="~/.ssh/train.pem"), "train.pem", "key pair's name"),
    Case("aws-up-key-name-space", up(key_name=" train"), "' train'", "printable ASCII"),
    Case("aws-up-key-name-non-ascii", up(key_name="clé"), "clé", "printable ASCII"),
    Case("aws-up-cluster-upper", up(cluster="Demo"), "Demo", "lowercase"),
    Case("aws-up-cluster-reserved", up(cluster="all"), "'all'", "pick another"),
    Case("aws-up-cluster-newline", up(cluster="demo\n"), "demo\\n", "lowercase"),
    Case("aws-up-region-no-number", up(region="us-east"), "us-east", "us-east-1"),
    Case("aws-up-region-upper", up(region="US-EAST-1"), "US-EAST-1", "us-east-1"),
    Case("aws-up-profile-missing", up(profile="nope"), "nope", "aws configure", env=NO_CONFIG),
    Case(
        "aws-up-endpoint-not-url",
        UP,
        "not a url",
        "AWS_ENDPOINT_URL=https://",
        env={"AWS_ENDPOINT_URL": "not a url"},
    ),
    Case(
        "aws-up-endpoint-ftp",
        UP,
        "ftp://example.com",
        "http(s) URL",
        env={"AWS_ENDPOINT_URL": "ftp://example.com"},
    ),
    Case(
        "aws-up-env-region-bad",
        UP,
        "mars",
        "pass --region",
        env={**NO_CONFIG, "AWS_DEFAULT_REGION": "mars"},
    ),
    Case(
        "aws-up-no-region",
        UP,
        "no AWS region",
        "AWS_DEFAULT_REGION",
        env={**NO_CONFIG, "AWS_DEFAULT_REGION": ""},
    ),
    Case(
        "aws-up-ssm-endpoint-bad",
        up(ami="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"),
        "localhost:4566",
        "AWS_ENDPOINT_URL_SSM=https://",
        env={"AWS_ENDPOINT_URL_SSM": "localhost:4566"},
    ),
    # ---------------------------------------------------------------- aws down
    Case("aws-down-wait-negative", [*DOWN, "--wait", "-1"], "'-1'", "from 1"),
    Case("aws-down-wait-word", [*DOWN, "--wait", "forever"], "forever", "whole number"),
    Case("aws-down-cluster-underscore", ["aws", "down", "--cluster", "my_cl"], "my_cl", "'-'"),
    Case(
        "aws-down-cluster-long", ["aws", "down", "--cluster", "a" * 40], "a" * 40, "31 characters"
    ),
    Case("aws-down-region-underscore", [*DOWN, "--region", "eu_west_1"], "eu_west_1", "eu-west-2"),
    Case(
        "aws-down-profile-missing", [*DOWN, "--profile", "nope"], "nope", "--profile", env=NO_CONFIG
    ),
    Case(
        "aws-down-endpoint-not-url",
        DOWN,
        "not a url",
        "unset it",
        env={"AWS_ENDPOINT_URL": "not a url"},
    ),
    Case(
        "aws-down-endpoint-ec2-no-host",
        DOWN,
        "http://",
        "AWS_ENDPOINT_URL_EC2=https://",
        env={"AWS_ENDPOINT_URL_EC2": "http://"},
    ),
    # ---------------------------------------------------------------- inventory aws
    Case("inv-aws-slots-zero", [*INV, "--slots", "0"], "--slots 0", "from 1 to 1024"),
    Case(
        "inv-aws-slots-huge",
        [*INV, "--slots", "99999999999"],
        "99999999999",
        "from 1 to 1024",
    ),
    Case("inv-aws-head-tag-no-eq", [*INV, "--head-tag", "role"], "role", "KEY=VALUE"),
    Case("inv-aws-head-tag-no-key", [*INV, "--head-tag", "=head"], "=head", "KEY=VALUE"),
    Case(
        "inv-aws-head-tag-newline",
        [*INV, "--head-tag", "role=head\n"],
        "role=head\\n",
        "one line",
    ),
    Case(
        "inv-aws-head-tag-long-key",
        [*INV, "--head-tag", "k" * 129 + "=v"],
        "k" * 129,
        "1-128 characters",
    ),
    Case("inv-aws-key-file-missing", [*INV, "--key-file", "missing.pem"], "missing.pem", "exist"),
    Case("inv-aws-key-file-dir", [*INV, "--key-file", "adir"], "adir", "give a file"),
    Case("inv-aws-out-file", [*INV, "--out", "existing.txt"], "existing.txt", "give a directory"),
    Case(
        "inv-aws-out-under-file",
        [*INV, "--out", "existing.txt/inv"],
        "existing.txt/inv",
        "choose another path",
    ),
    Case("inv-aws-user-space", [*INV, "--user", "Bad User"], "Bad User", "login name"),
    Case("inv-aws-cluster-reserved", ["inventory", "aws", "--cluster", "head"], "head", "another"),
    Case("inv-aws-region-bad", [*INV, "--region", "moon-1"], "moon-1", "us-east-1"),
    Case(
        "inv-aws-profile-missing", [*INV, "--profile", "ghost"], "ghost", "--profile", env=NO_CONFIG
    ),
    Case(
        "inv-aws-endpoint-not-url",
        INV,
        "not a url",
        "AWS_ENDPOINT_URL=https://",
        env={"AWS_ENDPOINT_URL": "not a url"},
    ),
]
