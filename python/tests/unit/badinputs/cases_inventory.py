"""Bad inventories (hosts.yml, group_vars/, host_vars/) under every command that reads one:
`inventory.load` refuses them (YAML, structure, then rules.yml's variable rules, host names and
the head group) before the command writes, runs or contacts anything."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import yaml

from .harness import Case

INV = ["-i", "inventories/demo"]
COMMANDS = {
    "hostfile": ["hostfile", *INV],
    "doctor": ["doctor", *INV],
    "launch": ["launch", *INV, "--", "train.py"],
    "smoke": ["smoke", *INV],
    "provision": ["provision", *INV],
    "dsconfig": ["dsconfig", *INV, "-o", "x.json"],
    "sbatch": ["sbatch", *INV, "--launcher", "torchrun", "--nodes", "2", "--", "train.py"],
}
ORDER = list(COMMANDS)


def _hosts_yml(home: pathlib.Path) -> pathlib.Path:
    return home / "inventories" / "demo" / "hosts.yml"


def inventory(
    all_vars: dict[str, Any] | None = None,
    n2: dict[str, Any] | None = None,
    head: tuple[str, ...] = ("n1",),
    workers: tuple[str, ...] = ("n2", "n3"),
) -> Callable[[pathlib.Path], None]:
    """A setup writing hosts.yml: the fixture's, with variables added or hosts changed."""

    def setup(home: pathlib.Path) -> None:
        address = {h: f"10.0.0.{i}" for i, h in enumerate((*head, *workers), start=1)}
        data = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "dscluster_cpu_slots": 2,
                    "dscluster_master_port": 29500,
                    **(all_vars or {}),
                },
                "children": {
                    "head": {"hosts": {h: {"ansible_host": address[h]} for h in head}},
                    "workers": {
                        "hosts": {
                            h: {"ansible_host": address[h], **((n2 or {}) if h == "n2" else {})}
                            for h in workers
                        }
                    },
                },
            }
        }
        _hosts_yml(home).write_text(yaml.safe_dump(data, sort_keys=False))

    return setup


def raw(text: bytes | str) -> Callable[[pathlib.Path], None]:
    def setup(home: pathlib.Path) -> None:
        data = text.encode() if isinstance(text, str) else text
        _hosts_yml(home).write_bytes(data)

    return setup


def var_file(rel: str, text: str) -> Callable[[pathlib.Path], None]:
    def setup(home: pathlib.Path) -> None:
        path = home / "inventories" / "demo" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    return setup


# (id, setup, value the line must name, a piece of the fix)
_BAD: list[tuple[str, Callable[[pathlib.Path], None], str, str]] = [
    # dscluster_cpu_slots: a whole number 1..1024, not a bool, a float or a quoted string.
    ("cpu-slots-word", inventory(n2={"dscluster_cpu_slots": "eight"}), "'eight'",
     "e.g. dscluster_cpu_slots: 2"),
    ("cpu-slots-float", inventory(n2={"dscluster_cpu_slots": 2.7}), "2.7", "from 1 to 1024"),
    ("cpu-slots-zero", inventory({"dscluster_cpu_slots": 0}), "is 0", "from 1 to 1024"),
    ("cpu-slots-negative", inventory({"dscluster_cpu_slots": -1}), "-1", "from 1 to 1024"),
    ("cpu-slots-bool", inventory({"dscluster_cpu_slots": True}), "true", "without quotes"),
    ("cpu-slots-quoted", inventory({"dscluster_cpu_slots": "2"}), "'2'", "without quotes"),
    ("cpu-slots-huge", inventory({"dscluster_cpu_slots": 99999999999}), "99999999999",
     "from 1 to 1024"),
    ("cpu-slots-list", inventory({"dscluster_cpu_slots": [2]}), "[2]", "from 1 to 1024"),
    ("cpu-slots-null", inventory(n2={"dscluster_cpu_slots": None}), "null", "from 1 to 1024"),
    # dscluster_master_port: 1..65535, never silently the default.
    ("master-port-zero", inventory({"dscluster_master_port": 0}), "is 0", "1 to 65535"),
    ("master-port-high", inventory({"dscluster_master_port": 70000}), "70000", "1 to 65535"),
    ("master-port-word", inventory({"dscluster_master_port": "abc"}), "'abc'", "1 to 65535"),
    ("master-port-float", inventory({"dscluster_master_port": 29500.5}), "29500.5",
     "1 to 65535"),
    # The training user and uid.
    ("training-user-root", inventory({"dscluster_training_user": "root"}), "'root'",
     "other than root"),
    ("training-user-upper", inventory({"dscluster_training_user": "Bob"}), "'Bob'",
     "dscluster_training_user: ds"),
    ("training-user-newline", inventory({"dscluster_training_user": "ds\n"}), "'ds\\n'",
     "dscluster_training_user: ds"),
    ("training-uid-low", inventory({"dscluster_training_uid": 12}), "is 12",
     "from 1000 to 65533"),
    ("training-uid-quoted", inventory({"dscluster_training_uid": "2000"}), "'2000'",
     "without quotes"),
    # Paths and storage.
    ("shared-dir-relative", inventory({"dscluster_shared_dir": "shared"}), "'shared'",
     "absolute path"),
    ("shared-dir-root", inventory({"dscluster_shared_dir": "/"}), "'/'", "other than '/'"),
    ("checkpoint-dir-space", inventory({"dscluster_checkpoint_dir": "/my ckpt"}),
     "'/my ckpt'", "without spaces"),
    ("jobs-dir-colon", inventory({"dscluster_jobs_dir": "/a:b"}), "'/a:b'", "colons"),
    ("venv-relative", inventory({"dscluster_venv": "venv"}), "'venv'", "absolute path"),
    ("pycache-dir-relative", inventory({"ml_stack_pycache_dir": "pyc"}), "'pyc'",
     "absolute path"),
    ("pycache-dir-space", inventory({"ml_stack_pycache_dir": "/my pyc"}), "'/my pyc'",
     "without spaces"),
    ("pycache-dir-list", inventory({"ml_stack_pycache_dir": ["/a"]}), "(a list)",
     'or "" for none'),
    ("pycache-dir-differs",
     inventory({"ml_stack_pycache_dir": "/a"}, n2={"ml_stack_pycache_dir": "/b"}), "n2='/b'",
     "group_vars/all"),
    # base_apt_deb_cache: an absolute directory every node mounts, or "" for none.
    ("deb-cache-relative", inventory({"base_apt_deb_cache": "debs"}), "'debs'",
     "absolute path"),
    ("deb-cache-root", inventory({"base_apt_deb_cache": "/"}), "'/'", "other than '/'"),
    ("deb-cache-list", inventory({"base_apt_deb_cache": ["/a"]}), "(a list)",
     'or "" for none'),
    ("deb-cache-differs",
     inventory({"base_apt_deb_cache": "/a"}, n2={"base_apt_deb_cache": "/b"}), "n2='/b'",
     "group_vars/all"),
    # DeepSpeed's op builder stops on an arch suffix (int('0a'), seen on an H200).
    ("cuda-arch-suffix", inventory({"ml_stack_cuda_arch_list": "8.0;9.0a"}), "'8.0;9.0a'",
     "without a suffix such as 9.0a"),
    ("cuda-arch-comma", inventory({"ml_stack_cuda_arch_list": "8.0,9.0"}), "'8.0,9.0'",
     "separated by ';' or spaces"),
    ("storage-typo", inventory({"dscluster_shared_storage": "nfs4"}), "'nfs4'",
     "one of nfs, lustre, external, none"),
    ("storage-bool", inventory({"dscluster_shared_storage": True}), "true",
     "one of nfs, lustre, external, none"),
    # extra_env: NAME -> one scalar.
    ("extra-env-list", inventory({"dscluster_extra_env": ["A=1"]}), "A=1",
     "dscluster_extra_env: {OMP_NUM_THREADS: 4}"),
    ("extra-env-dash-key", inventory({"dscluster_extra_env": {"MY-VAR": 1}}), "MY-VAR",
     "environment variable names"),
    ("extra-env-nested", inventory({"dscluster_extra_env": {"A": {"B": 1}}}), "B: 1",
     "single values"),
    ("extra-env-null-value", inventory({"dscluster_extra_env": {"A": None}}), "A: null",
     "single values"),
    ("extra-env-string", inventory({"dscluster_extra_env": "A=1"}), "'A=1'",
     "dscluster_extra_env: {OMP_NUM_THREADS: 4}"),
    # secret_env: NAME -> one scalar, as extra_env (the value never in the message).
    ("secret-env-list", inventory({"dscluster_secret_env": ["HF_TOKEN=x"]}), "dscluster_secret_env",
     "dscluster_secret_env: {HF_TOKEN:"),
    ("secret-env-dash-key", inventory({"dscluster_secret_env": {"HF-TOKEN": "x"}}), "HF-TOKEN",
     "environment variable names"),
    ("secret-env-nested", inventory({"dscluster_secret_env": {"A": {"B": 1}}}),
     "dscluster_secret_env", "single values"),
    # cluster_ssh_key_from_extra: from= sources; a comma or quote would widen the option.
    ("key-from-comma-item", inventory({"cluster_ssh_key_from_extra": ["10.0.0.1,*"]}),
     "item '10.0.0.1,*' is not an address, a CIDR or an sshd pattern",
     'cluster_ssh_key_from_extra: ["10.0.0.0/16"'),
    ("key-from-quote-item", inventory({"cluster_ssh_key_from_extra": ['10.0.0.1" ']}),
     "is not an address, a CIDR or an sshd pattern", "no commas, quotes or spaces"),
    ("key-from-string", inventory({"cluster_ssh_key_from_extra": "10.0.0.0/16"}),
     "'10.0.0.0/16' (a string)", 'cluster_ssh_key_from_extra: ["10.0.0.0/16"'),
    # base_extra_packages: a list of Debian package names.
    ("extra-packages-string", inventory({"base_extra_packages": "htop vim"}),
     "'htop vim' (a string)", "base_extra_packages: [htop, nvtop]"),
    ("extra-packages-comma-item", inventory(n2={"base_extra_packages": ["htop,vim"]}),
     "item 'htop,vim' is not a Debian package name", "a list of Debian package names"),
    ("extra-packages-number-item", inventory({"base_extra_packages": ["htop", 7]}),
     "item 7 is a whole number", "base_extra_packages: [htop, nvtop]"),
    # Other rules.
    ("expected-slots-negative", inventory(n2={"dscluster_expected_slots": -1}), "-1",
     "from 0 to 1024"),
    ("nccl-ifname-space", inventory({"dscluster_nccl_socket_ifname": "eth 0"}), "'eth 0'",
     "dscluster_nccl_socket_ifname: eth0"),
    ("slurm-yes-string", inventory({"dscluster_slurm": "yes"}), "'yes'", "true or false"),
    ("efa-supported-typo", inventory(n2={"dscluster_efa_supported": "flase"}), "'flase'",
     "true or false"),
    ("cluster-name-slash", inventory({"dscluster_cluster_name": "a/b"}), "'a/b'",
     "dscluster_cluster_name: demo"),
    ("cluster-wide-differs",
     inventory({"dscluster_training_uid": 2000}, n2={"dscluster_training_uid": 2001}), "n2=2001",
     "group_vars/all"),
    # Unknown variables (typos).
    ("unknown-var-typo", inventory({"dscluster_cpu_slot": 2}), "dscluster_cpu_slot",
     "did you mean dscluster_cpu_slots"),
    ("unknown-var-host", inventory(n2={"dscluster_master_prot": 1}), "dscluster_master_prot",
     "did you mean dscluster_master_port"),
    # Host names and groups.
    ("host-named-all", inventory(workers=("n2", "all")), "'all'", "reserved"),
    ("host-named-localhost", inventory(workers=("n2", "localhost")), "'localhost'",
     "reserved"),
    ("two-heads", inventory(head=("n1", "n2"), workers=("n3",)), "2 hosts in group 'head'",
     "exactly one"),
    ("no-head", inventory(head=(), workers=("n1", "n2")), "0 hosts in group 'head'",
     "exactly one"),
    ("head-also-worker", inventory(workers=("n1", "n2")), "n1 is in both",
     "remove it from 'workers'"),
    # The file itself.
    ("yaml-tab", raw("all:\n  children:\n\thead:\n      hosts: {n1: {}}\n"), "line 3",
     "fix the YAML"),
    ("yaml-unclosed-bracket", raw("all:\n  hosts: {n1: {}, n2: {}\n"), "line 3",
     "fix the YAML"),
    ("yaml-bad-indent", raw("all:\n  children:\n    head:\n      hosts:\n     n1: {}\n"),
     "line 5", "fix the YAML"),
    ("non-utf8", raw(b"all:\n  hosts:\n    n\xff1: {}\n"), "bad byte at line 3",
     "save it as UTF-8"),
    ("all-a-list", raw("all: [a, b]\n"), "[a, b]", "must be a mapping"),
    ("hosts-a-list", raw("all:\n  children:\n    head:\n      hosts: [n1]\n"), "[n1]",
     "not a list"),
    ("top-level-list", raw("- n1\n- n2\n"), "a list", "a mapping of groups"),
    ("empty-file", raw(""), "is empty", "add hosts under"),
    ("only-comments", raw("# hosts go here\n"), "is empty", "add hosts under"),
    ("host-vars-a-string", raw("all:\n  children:\n    head:\n      hosts:\n        n1: x\n"),
     "'x'", "n1: {}"),
    # group_vars / host_vars files beside hosts.yml.
    ("group-vars-bad-port", var_file("group_vars/all.yml", "dscluster_master_port: 0\n"),
     "group_vars/all.yml", "1 to 65535"),
    ("host-vars-bad-slots", var_file("host_vars/n3.yml", "dscluster_cpu_slots: many\n"),
     "host_vars/n3.yml", "e.g. dscluster_cpu_slots: 2"),
    ("group-vars-yaml-error", var_file("group_vars/workers.yml", "a: [1\n"),
     "group_vars/workers.yml", "fix the YAML"),
    ("group-vars-a-list", var_file("group_vars/all.yml", "- dscluster_cpu_slots: 2\n"),
     "group_vars/all.yml", "must be a mapping of variables"),
    # ml_stack's user layer: refused before the first play, not minutes into the ml_stack play.
    ("extra-requirements-string",
     inventory({"ml_stack_extra_requirements": "transformers==4.57.1"}),
     "'transformers==4.57.1' (a string)", 'ml_stack_extra_requirements: ["transformers==4.57.1"'),
    ("extra-requirements-option-item",
     var_file("group_vars/all.yml", "ml_stack_extra_requirements: ['-r requirements.txt']\n"),
     "item '-r requirements.txt' is not a requirement", "goes in ml_stack_requirements_file"),
    ("requirements-file-relative", inventory({"ml_stack_requirements_file": "requirements.txt"}),
     "'requirements.txt'", "the absolute path (~ allowed)"),
    ("requirements-file-missing",
     inventory({"ml_stack_requirements_file": "/nonexistent/dscluster/requirements.txt"}),
     "'/nonexistent/dscluster/requirements.txt' (no such file on the controller)",
     "a file on the controller"),
    ("uv-compile-args-string",
     inventory({"ml_stack_uv_compile_args": "--index-url https://mirror.example/simple"}),
     "'--index-url https://mirror.example/simple' (a string)", "one argument per item"),
]  # fmt: skip


def _cases() -> list[Case]:
    cases = []
    for i, (ident, setup, value, fix) in enumerate(_BAD):
        command = ORDER[i % len(ORDER)]
        cases.append(
            Case(f"inventory-{ident}-{command}", COMMANDS[command], value, fix, setup=setup)
        )
    return cases


def _home_file(rel: str, data: bytes) -> Callable[[pathlib.Path], None]:
    def setup(home: pathlib.Path) -> None:
        (home / "inventories" / "demo" / rel).write_bytes(data)

    return setup


# What doctor reads from the controller besides the inventory: refused before its playbook.
_DOCTOR: list[tuple[str, Callable[[pathlib.Path], None], str, str]] = [
    ("hostfile-slots-word", _home_file("hostfile", b"n1 slots=two\n"), "'n1 slots=two'",
     "rewrite it with 'dscluster hostfile'"),
    ("hostfile-slots-huge", _home_file("hostfile", b"n1 slots=99999999999\n"), "99999999999",
     "host slots=N"),
    ("hostfile-no-slots", _home_file("hostfile", b"n1\nn2 slots=2\n"), "line 1",
     "host slots=N"),
    ("hostfile-not-utf8", _home_file("hostfile", b"n1 slots=2\n\xff\n"), "bad byte at line 2",
     "save it as UTF-8"),
    ("facts-not-utf8", _home_file("facts/n2.json", b'{"address": "\xff"}'), "n2.json",
     "save it as UTF-8"),
    ("deepspeed-env-not-utf8", _home_file(".deepspeed_env", b"A=\xff\n"), ".deepspeed_env",
     "save it as UTF-8"),
]  # fmt: skip

CASES = _cases() + [
    Case(f"doctor-{ident}", COMMANDS["doctor"], value, fix, setup=setup)
    for ident, setup, value, fix in _DOCTOR
]

# The mitogen switch is read before any command runs.
CASES += [
    Case("mitogen-not-a-switch", COMMANDS["provision"], "DSCLUSTER_MITOGEN='yes'",
         "DSCLUSTER_MITOGEN=1", env={"DSCLUSTER_MITOGEN": "yes"}),
]  # fmt: skip
