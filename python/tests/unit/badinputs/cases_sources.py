"""Bad inputs to the inventory sources and the launch-file writer: `inventory static`
(host lists, slots, --head, --name, -o, --user, --key-file, --known-hosts), `inventory
slurm` (--nodelist and Slurm's variables) and `hostfile` (recorded facts, extra_env)."""

from __future__ import annotations

import json
import pathlib

from .harness import Case

STATIC = ["inventory", "static", "--hosts"]
SLURM = ["inventory", "slurm", "--nodelist"]
HOSTFILE = ["hostfile", "-i", "inventories/demo"]
FACTS = pathlib.Path("inventories/demo/facts")


def _facts(host: str, change) -> object:
    """setup(home): rewrite one host's facts file with change(data) (or raw bytes)."""

    def setup(home: pathlib.Path) -> None:
        path = home / FACTS / f"{host}.json"
        new = change(json.loads(path.read_text())) if callable(change) else change
        if isinstance(new, bytes):
            path.write_bytes(new)
        else:
            path.write_text(json.dumps(new))

    return setup


def _set(dotted: str, value: object):
    def change(data: dict) -> dict:
        node = data
        *path, last = dotted.split(".")
        for key in path:
            node = node[key]
        if value is _DROP:
            del node[last]
        else:
            node[last] = value
        return data

    return change


_DROP = object()


def _all_vars(yaml_line: str):
    """setup(home): add one line under all.vars of inventories/demo/hosts.yml."""

    def setup(home: pathlib.Path) -> None:
        hosts = home / "inventories" / "demo" / "hosts.yml"
        text = hosts.read_text()
        hosts.write_text(text.replace("  vars:\n", f"  vars:\n    {yaml_line}\n", 1))

    return setup


def _mkdir(path: str):
    def setup(home: pathlib.Path) -> None:
        (home / path).mkdir(parents=True)

    return setup


def _write(path: str, data: bytes):
    def setup(home: pathlib.Path) -> None:
        (home / path).write_bytes(data)

    return setup


STATIC_CASES = [
    Case("static-hosts-trailing-newline", [*STATIC, "a,b\n"], "'a,b\\n'", "on one line"),
    Case("static-hosts-tab", [*STATIC, "a\tb"], "'a\\tb'", "on one line"),
    Case("static-hosts-reverse-range", [*STATIC, "node[5-1]"], "node[5-1]", "low-high"),
    Case("static-hosts-huge-range", [*STATIC, "node[01-99999]"], "node[01-99999]", "fewer"),
    Case(
        "static-hosts-absurd-range",
        [*STATIC, "n[0-99999999999999999999999]"],
        "n[0-99999999999999999999999]",
        "prefix[01-16]",
    ),
    Case(
        "static-hosts-many-items",
        [*STATIC, "a[0-5000],b[0-5000],c[0-5000],d[0-5000]"],
        "a[0-5000]",
        "list fewer hosts",
    ),
    Case("static-hosts-empty-item", [*STATIC, "a,,b"], "'a,,b'", "single commas"),
    Case("static-hosts-trailing-comma", [*STATIC, "a,b,"], "'a,b,'", "single commas"),
    Case("static-hosts-empty", [*STATIC, ""], "''", "at least one host"),
    Case("static-hosts-duplicate", [*STATIC, "a,b,a"], "a appears twice", "once"),
    Case("static-hosts-duplicate-range", [*STATIC, "n[1-3],n2"], "n2 appears twice", "once"),
    Case("static-slots-huge", [*STATIC, "a:99999999999"], "99999999999", "1-1024"),
    Case("static-slots-negative", [*STATIC, "a:-2"], "'a:-2'", "whole number 1-1024"),
    Case("static-slots-word", [*STATIC, "a:x"], "'a:x'", "whole number 1-1024"),
    Case("static-slots-zero", [*STATIC, "a:0"], "slots=0", "whole number 1-1024"),
    Case("static-slots-empty", [*STATIC, "a:"], "'a:'", "whole number 1-1024"),
    Case("static-ipv6", [*STATIC, "fe80::1"], "fe80::1", "put the address in ansible_host"),
    Case("static-ipv6-brackets", [*STATIC, "[::1]:4"], "[::1]:4", "ansible_host"),
    Case("static-host-space", [*STATIC, "bad host"], "bad host", "letters, digits"),
    Case("static-host-shell", [*STATIC, "a;reboot"], "a;reboot", "letters, digits"),
    Case("static-host-dash", ["inventory", "static", "--hosts=-a"], "'-a'", "starting with"),
    Case("static-host-reserved", [*STATIC, "all"], "'all'", "pick another"),
    Case("static-host-unicode", [*STATIC, "nöde1"], "nöde1", "letters, digits"),
    Case("static-unclosed", [*STATIC, "n[1-3"], "n[1-3", "fix the brackets"),
    Case("static-unmatched", [*STATIC, "n1-3]"], "n1-3]", "fix the brackets"),
    Case("static-nested", [*STATIC, "n[1[2]]"], "n[1[2]]", "prefix[01-16]"),
    Case("static-bad-range", [*STATIC, "n[a-b]"], "n[a-b]", "prefix[01-16]"),
    Case("static-empty-range", [*STATIC, "n[]"], "n[]", "prefix[01-16]"),
    Case(
        "static-head-not-listed",
        [*STATIC, "a,b", "--head", "c"],
        "--head c",
        "pass one of the listed hosts",
    ),
    Case(
        "static-head-newline",
        [*STATIC, "a,b", "--head", "a\n"],
        "'a\\n'",
        "pass one of the listed hosts",
    ),
    Case("static-slots-flag-zero", [*STATIC, "a", "--slots", "0"], "--slots 0", "from 1 to 1024"),
    Case("static-slots-flag-huge", [*STATIC, "a", "--slots", "5000"], "5000", "from 1 to 1024"),
    Case("static-name-upper", [*STATIC, "a", "--name", "Lab"], "'Lab'", "lowercase"),
    Case("static-name-reserved", [*STATIC, "a", "--name", "all"], "'all'", "pick another"),
    Case("static-name-newline", [*STATIC, "a", "--name", "lab\n"], "'lab\\n'", "lowercase"),
    Case("static-out-file", [*STATIC, "a", "-o", "existing.txt"], "existing.txt", "directory"),
    Case(
        "static-out-under-file",
        [*STATIC, "a", "-o", "existing.txt/inv"],
        "existing.txt",
        "choose another path",
    ),
    Case(
        "static-out-hosts-yml-is-dir",
        [*STATIC, "a", "-o", "adir"],
        "hosts.yml",
        "give a file path",
        setup=_mkdir("adir/hosts.yml"),
    ),
    Case(
        "static-out-hostfile-is-dir",
        [*STATIC, "a", "-o", "adir"],
        "hostfile",
        "give a file path",
        setup=_mkdir("adir/hostfile"),
    ),
    Case("static-key-file-missing", [*STATIC, "a", "--key-file", "nokey"], "nokey", "must exist"),
    Case("static-key-file-dir", [*STATIC, "a", "--key-file", "adir"], "adir", "must exist"),
    Case(
        "static-known-hosts-missing",
        [*STATIC, "a", "--known-hosts", "no_known_hosts"],
        "no_known_hosts",
        "must exist",
    ),
    Case("static-user-shell", [*STATIC, "a", "--user", "root;id"], "root;id", "login name"),
]

SLURM_CASES = [
    Case(
        "slurm-cpus-per-node-huge-repeat",
        [*SLURM, "n[1-2]"],
        "2(x99999999999)",
        "--slots",
        env={"SLURM_JOB_CPUS_PER_NODE": "2(x99999999999)"},
    ),
    Case(
        "slurm-cpus-per-node-word",
        [*SLURM, "n[1-2]"],
        "lots",
        "--slots",
        env={"SLURM_JOB_CPUS_PER_NODE": "lots"},
    ),
    Case(
        "slurm-cpus-per-node-x0",
        [*SLURM, "n[1-2]"],
        "2(x0)",
        "--slots",
        env={"SLURM_JOB_CPUS_PER_NODE": "2(x0)"},
    ),
    Case(
        "slurm-cpus-per-node-mismatch",
        [*SLURM, "n[1-3]"],
        "describes 2 nodes",
        "--slots",
        env={"SLURM_JOB_CPUS_PER_NODE": "2(x2)"},
    ),
    Case(
        "slurm-cpus-per-node-zero",
        [*SLURM, "n[1-3]"],
        "0(x3)",
        "--slots",
        env={"SLURM_JOB_CPUS_PER_NODE": "0(x3)"},
    ),
    Case(
        "slurm-cpus-per-node-huge-count",
        [*SLURM, "n[1-2]"],
        "99999(x2)",
        "1-1024",
        env={"SLURM_JOB_CPUS_PER_NODE": "99999(x2)"},
    ),
    Case(
        "slurm-gpus-on-node-word",
        [*SLURM, "n[1-2]"],
        "SLURM_GPUS_ON_NODE='abc'",
        "--slots",
        env={"SLURM_GPUS_ON_NODE": "abc"},
    ),
    Case(
        "slurm-gpus-on-node-huge",
        [*SLURM, "n[1-2]"],
        "SLURM_GPUS_ON_NODE",
        "1-1024",
        env={"SLURM_GPUS_ON_NODE": "5000"},
    ),
    Case(
        "slurm-ntasks-negative",
        [*SLURM, "n[1-2]"],
        "SLURM_NTASKS_PER_NODE='-1'",
        "--slots",
        env={"SLURM_NTASKS_PER_NODE": "-1"},
    ),
    Case(
        "slurm-gpus-per-node-word",
        [*SLURM, "n[1-2]"],
        "a100:many",
        "--slots",
        env={"SLURM_GPUS_PER_NODE": "a100:many"},
    ),
    Case(
        "slurm-env-nodelist-reverse",
        ["inventory", "slurm"],
        "n[5-1]",
        "low-high",
        env={"SLURM_JOB_NODELIST": "n[5-1]", "SLURM_JOB_ID": "7"},
    ),
    Case("slurm-nodelist-reverse", [*SLURM, "n[5-1]"], "n[5-1]", "low-high"),
    Case("slurm-nodelist-huge", [*SLURM, "n[0-99999999]"], "n[0-99999999]", "list fewer"),
    Case("slurm-nodelist-duplicate", [*SLURM, "n1,n1"], "node n1 appears twice", "list it once"),
    Case("slurm-nodelist-empty-item", [*SLURM, "n1,,n2"], "'n1,,n2'", "as Slurm prints it"),
    Case("slurm-nodelist-newline", [*SLURM, "n1\n"], "'n1\\n'", "on one line"),
    Case("slurm-nodelist-bad-name", [*SLURM, "bad_[1-2]!"], "bad_[1-2]!", "letters, digits"),
    Case("slurm-nodelist-unclosed", [*SLURM, "n[1-"], "n[1-", "fix the brackets"),
    Case("slurm-nodelist-ipv6", [*SLURM, "fe80::1"], "fe80::1", "ansible_host"),
    Case("slurm-name-bad", [*SLURM, "n1", "--name", "Bad"], "'Bad'", "lowercase"),
    Case("slurm-out-file", [*SLURM, "n1", "-o", "existing.txt"], "existing.txt", "directory"),
    Case("slurm-slots-zero", [*SLURM, "n1", "--slots", "0"], "--slots 0", "from 1 to 1024"),
    Case("slurm-key-file-missing", [*SLURM, "n1", "--key-file", "nokey"], "nokey", "must exist"),
]

HOSTFILE_CASES = [
    Case(
        "hostfile-facts-not-utf8",
        HOSTFILE,
        "n2.json",
        "save it as UTF-8",
        setup=_facts("n2", b'{"host": "n2\xff\xfe"}'),
    ),
    Case("hostfile-facts-list", HOSTFILE, "a list, not a mapping", "provision", _facts("n1", [1])),
    Case("hostfile-facts-bad-json", HOSTFILE, "not valid JSON", "provision", _facts("n3", b"{")),
    Case(
        "hostfile-facts-count-word",
        HOSTFILE,
        "'two'",
        "provision",
        setup=_facts("n1", _set("accelerators.count", "two")),
    ),
    Case(
        "hostfile-facts-cpu-slots-float",
        HOSTFILE,
        "2.7",
        "provision",
        setup=_facts("n2", _set("cpu_slots", 2.7)),
    ),
    Case(
        "hostfile-facts-accelerators-list",
        HOSTFILE,
        "accelerators is []",
        "provision",
        setup=_facts("n1", _set("accelerators", [])),
    ),
    Case(
        "hostfile-facts-no-venv",
        HOSTFILE,
        "versions.venv is missing",
        "provision",
        setup=_facts("n1", _set("versions.venv", _DROP)),
    ),
    Case(
        "hostfile-facts-nvidia-list",
        HOSTFILE,
        "nvidia is a list",
        "provision",
        setup=_facts("n3", _set("accelerators.nvidia", ["A100"])),
    ),
    Case(
        "hostfile-facts-nccl-env-list",
        HOSTFILE,
        "nccl_env",
        "provision",
        setup=_facts("n1", _set("nccl_env", ["eth0"])),
    ),
    Case(
        "hostfile-facts-zero-slots",
        HOSTFILE,
        "slots=0",
        "dscluster_cpu_slots",
        setup=_facts("n2", _set("cpu_slots", 0)),
    ),
    Case(
        "hostfile-facts-huge-slots",
        HOSTFILE,
        "slots=5000",
        "1-1024",
        setup=_facts("n2", _set("cpu_slots", 5000)),
    ),
    Case(
        "hostfile-extra-env-null",
        HOSTFILE,
        "OMP_NUM_THREADS: null",
        "single values",
        setup=_all_vars("dscluster_extra_env: {OMP_NUM_THREADS: null}"),
    ),
    Case(
        "hostfile-extra-env-mapping",
        HOSTFILE,
        "NCCL is a mapping",
        "single values",
        setup=_all_vars("dscluster_extra_env: {NCCL: {DEBUG: INFO}}"),
    ),
    Case(
        "hostfile-extra-env-list",
        HOSTFILE,
        "(a list)",
        "single values",
        setup=_all_vars("dscluster_extra_env: [OMP_NUM_THREADS=4]"),
    ),
    Case(
        "hostfile-extra-env-bad-key",
        HOSTFILE,
        "'1X'",
        "single values",
        setup=_all_vars("dscluster_extra_env: {1X: 4}"),
    ),
    Case(
        "hostfile-extra-env-dollar",
        HOSTFILE,
        "'$'",
        "remove those characters",
        setup=_all_vars("dscluster_extra_env: {DATA: $HOME/data}"),
    ),
    Case(
        "hostfile-extra-env-nan",
        HOSTFILE,
        "LR is nan",
        "single values",
        setup=_all_vars("dscluster_extra_env: {LR: .nan}"),
    ),
    Case(
        "hostfile-degraded-not-utf8",
        HOSTFILE,
        "degraded.json",
        "save it as UTF-8",
        setup=_write("inventories/demo/degraded.json", b"\xff{}"),
    ),
]

CASES = [*STATIC_CASES, *SLURM_CASES, *HOSTFILE_CASES]
