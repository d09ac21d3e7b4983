"""Bad inputs to local, image, provision, smoke, launch, doctor, dsconfig, sbatch and the
top level: options and the files they read. (Inventories: cases_inventory.py; host lists,
Slurm, facts and launch files: cases_sources.py; AWS: cases_aws.py.)"""

from __future__ import annotations

import pathlib

from .harness import Case

INV = ["-i", "inventories/demo"]
RUN = ["--", "train.py"]


def _write(rel: str, data: bytes):
    def setup(home: pathlib.Path) -> None:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return setup


def _link(rel: str, target: str):
    def setup(home: pathlib.Path) -> None:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).symlink_to(target)

    return setup


def _ports(prefix: list[str], tail: list[str], tag: str) -> list[Case]:
    return [
        Case(f"{tag}-port-{name}", [*prefix, "--master-port", value, *tail], value, fix)
        for name, value, fix in (
            ("zero", "0", "1 to 65535"),
            ("high", "70000", "1 to 65535"),
            ("negative", "-1", "1 to 65535"),
            ("word", "http", "e.g. 29500"),
        )
    ]


def _mode_cases(prefix: list[str], tag: str) -> list[Case]:
    """--accelerate-config / --accelerate-config-kind, shared by launch and sbatch."""
    acc = [*prefix, "--launcher", "accelerate"]
    return [
        Case(
            f"{tag}-accelerate-config-missing",
            [*acc, "--accelerate-config", "nope.yaml", *RUN],
            "nope.yaml",
            "give an existing file",
        ),
        Case(
            f"{tag}-accelerate-config-dir",
            [*acc, "--accelerate-config", "adir", *RUN],
            "adir",
            "give a file",
        ),
        Case(
            f"{tag}-accelerate-config-suffix",
            [*acc, "--accelerate-config", "existing.txt", *RUN],
            "existing.txt",
            ".yaml, .yml or .json",
        ),
        Case(
            f"{tag}-accelerate-config-bad-yaml",
            [*acc, "--accelerate-config", "acc.yaml", *RUN],
            "acc.yaml",
            "accelerate config",
            setup=_write("acc.yaml", b"distributed_type: [MULTI_GPU\n"),
        ),
        Case(
            f"{tag}-accelerate-config-bad-json",
            [*acc, "--accelerate-config", "acc.json", *RUN],
            "acc.json",
            "not valid JSON",
            setup=_write("acc.json", b"{distributed_type: MULTI_GPU}"),
        ),
        Case(
            f"{tag}-accelerate-config-no-type",
            [*acc, "--accelerate-config", "acc.yml", *RUN],
            "acc.yml",
            "distributed_type: MULTI_GPU",
            setup=_write("acc.yml", b"num_processes: 4\n"),
        ),
        Case(
            f"{tag}-accelerate-config-not-utf8",
            [*acc, "--accelerate-config", "acc.yaml", *RUN],
            "acc.yaml",
            "UTF-8",
            setup=_write("acc.yaml", b"distributed_type: \xff\n"),
        ),
        Case(
            f"{tag}-accelerate-config-other-launcher",
            [*prefix, "--launcher", "torchrun", "--accelerate-config", "existing.txt", *RUN],
            "--accelerate-config",
            "--launcher accelerate",
        ),
        Case(
            f"{tag}-accelerate-kind-other-launcher",
            [*prefix, "--launcher", "deepspeed", "--accelerate-config-kind", "ddp", *RUN],
            "--accelerate-config-kind",
            "--launcher accelerate",
        ),
        Case(
            f"{tag}-accelerate-kind-and-config",
            [*acc, "--accelerate-config-kind", "ddp", "--accelerate-config", "acc.yaml", *RUN],
            "--accelerate-config-kind ddp",
            "pass one of them",
            setup=_write("acc.yaml", b"distributed_type: MULTI_GPU\n"),
        ),
        Case(
            f"{tag}-accelerate-kind-typo",
            [*acc, "--accelerate-config-kind", "zero3", *RUN],
            "zero3",
            "deepspeed",
        ),
    ]


CASES = [
    # top level
    Case("home-empty", ["--home", "", "hostfile", *INV], "--home", "give a directory"),
    Case("home-file", ["--home", "existing.txt", "hostfile", *INV], "existing.txt", "directory"),
    Case("unknown-command", ["provison", *INV], "provison", "--help"),
    Case("unknown-option", ["hostfile", *INV, "--slot", "2"], "--slot", "--help"),
    # local up / down / image
    Case("local-nodes-zero", ["local", "up", "--nodes", "0"], "--nodes 0", "from 1 to 64"),
    Case("local-nodes-huge", ["local", "up", "--nodes", "100000"], "100000", "from 1 to 64"),
    Case("local-nodes-word", ["local", "up", "--nodes", "three"], "three", "e.g. 3"),
    Case("local-nodes-float", ["local", "up", "--nodes", "2.5"], "2.5", "whole number"),
    Case("local-name-upper", ["local", "up", "--name", "Demo"], "Demo", "lowercase"),
    Case(
        "local-image-bad-ref",
        ["local", "up", "--image", "My Image"],
        "'My Image'",
        "e.g. debian:bookworm",
    ),
    Case(
        "local-base-bad-ref",
        ["local", "up", "--base", "Debian Trixie"],
        "'Debian Trixie'",
        "e.g. debian:bookworm",
    ),
    Case(
        "local-image-and-base",
        ["local", "up", "--image", "dscluster/baked:x", "--base", "debian:trixie"],
        "--base debian:trixie",
        "give one",
    ),
    Case("bake-node-unknown", ["image", "bake", *INV, "--node", "n9"], "'n9'", "n1, n2, n3"),
    Case("bake-not-local-or-aws", ["image", "bake", *INV], "neither", "own imaging tool"),
    Case("local-name-newline", ["local", "up", "--name", "demo\n"], "demo", "lowercase"),
    Case("local-name-reserved", ["local", "up", "--name", "all"], "'all'", "pick another"),
    Case("local-name-slash", ["local", "down", "--name", "../x"], "../x", "lowercase"),
    Case("local-shm-word", ["local", "up", "--shm-size", "abc"], "abc", "e.g. --shm-size 1g"),
    Case("local-shm-zero", ["local", "up", "--shm-size", "0"], "'0'", "1m to 1024g"),
    Case("local-shm-unit", ["local", "up", "--shm-size", "1gb"], "1gb", "b, k, m or g"),
    Case("local-slots-zero", ["local", "up", "--slots", "0"], "--slots 0", "from 1 to 1024"),
    Case("local-slots-huge", ["local", "up", "--slots", "99999999999"], "99999999999", "1024"),
    Case("image-base-bad", ["image", "--base", "Debian Bookworm"], "Debian Bookworm", "name[:tag]"),
    Case("image-base-shell", ["image", "--base", "x;rm -rf /"], "x;rm", "e.g. debian:bookworm"),
    # make demo NODE_OS=foo gives --base debian:foo: refused before any pull or debootstrap
    Case("image-base-debian-unknown", ["image", "--base", "debian:foo"], "debian:foo", "trixie"),
    Case(
        "local-base-debian-old",
        ["local", "up", "--base", "debian:bullseye-slim"],
        "bullseye-slim",
        "debian:bookworm (12) or debian:trixie (13)",
    ),
    # provision / hostfile
    Case("prov-tags-typo", ["provision", *INV, "--tags", "ml_stak"], "ml_stak", "ml_stack"),
    Case("prov-tags-empty", ["provision", *INV, "--tags", "base,,pdsh"], "base,,pdsh", "commas"),
    Case(
        "prov-playbook-path", ["provision", *INV, "--playbook", "../x.yml"], "../x.yml", "site.yml"
    ),
    Case(
        "prov-playbook-abs",
        ["provision", *INV, "--playbook", "/etc/passwd"],
        "/etc/passwd",
        "ansible-playbook",
    ),
    Case(
        "prov-playbook-missing",
        ["provision", *INV, "--playbook", "nope.yml"],
        "nope.yml",
        "site.yml",
    ),
    Case("prov-limit-typo", ["provision", *INV, "--limit", "n9"], "n9", "n1, n2, n3"),
    Case("prov-limit-typo-list", ["provision", *INV, "--limit", "n1,nn2"], "nn2", "n1, n2, n3"),
    Case("prov-limit-wildcard", ["provision", *INV, "--limit", "gpu*"], "gpu*", "n1, n2, n3"),
    Case("prov-limit-regex", ["provision", *INV, "--limit", "~^x"], "~^x", "or a group"),
    Case("prov-limit-colon", ["provision", *INV, "--limit", "head:wrkers"], "wrkers", "workers"),
    Case("prov-limit-excluded-typo", ["provision", *INV, "--limit", "all:!n7"], "n7", "n1, n2"),
    Case("prov-limit-empty", ["provision", *INV, "--limit", " "], "--limit", "give hosts"),
    Case("prov-timeout-negative", ["provision", *INV, "--timeout", "-1"], "--timeout -1", "from 1"),
    Case("prov-timeout-zero", ["provision", *INV, "--timeout", "0"], "--timeout 0", "from 1"),
    Case("prov-add-unknown", ["provision", *INV, "--add", "n9"], "'n9'", "n1, n2, n3"),
    Case("prov-add-typo-list", ["provision", *INV, "--add", "n3,nn2"], "'nn2'", "local up"),
    Case("prov-add-empty", ["provision", *INV, "--add", "n2,"], "n2,", "e.g. --add n3,n4"),
    Case("prov-add-head", ["provision", *INV, "--add", "n1"], "'n1'", "without --add"),
    Case("prov-add-limit", ["provision", *INV, "--add", "n3", "--limit", "n3"], "--limit", "drop"),
    Case("prov-add-tags", ["provision", *INV, "--add", "n3", "--tags", "base"], "--tags", "drop"),
    Case(
        "prov-add-playbook",
        ["provision", *INV, "--add", "n3", "--playbook", "base.yml"],
        "base.yml",
        "drop --playbook",
    ),
    Case(
        "prov-no-inventory",
        ["provision", "-i", "inventories/nope"],
        "inventories/nope",
        "-i inventories/<name>",
    ),
    Case("hostfile-no-inventory", ["hostfile", "-i", "nowhere"], "nowhere", "dscluster local up"),
    Case("hostfile-dir-without-hosts", ["hostfile", "-i", "adir"], "adir", "hosts.yml"),
    # smoke
    Case("smoke-steps-negative", ["smoke", *INV, "--steps", "-5"], "--steps -5", "from 1"),
    Case("smoke-steps-zero", ["smoke", *INV, "--steps", "0"], "--steps 0", "from 1"),
    Case("smoke-steps-word", ["smoke", *INV, "--steps", "ten"], "ten", "e.g. 30"),
    Case("smoke-steps-huge", ["smoke", *INV, "--steps", "99999999999"], "99999999999", "10000000"),
    Case("smoke-straggler-nan", ["smoke", *INV, "--straggler-factor", "nan"], "nan", "e.g. 2"),
    Case("smoke-straggler-inf", ["smoke", *INV, "--straggler-factor", "inf"], "inf", "e.g. 2"),
    Case("smoke-straggler-half", ["smoke", *INV, "--straggler-factor", "0.5"], "0.5", "from 1"),
    Case(
        "smoke-device-threshold-nan",
        ["smoke", *INV, "--device-bench-threshold", "nan"],
        "nan",
        "e.g. 0.2",
    ),
    Case("smoke-device-bench-zero", ["smoke", *INV, "--device-bench-s", "0"], "0", "above 0"),
    Case("smoke-fabric-fraction-2", ["smoke", *INV, "--min-fabric-fraction", "2"], "2", "e.g. 0.5"),
    Case("smoke-fabric-typo", ["smoke", *INV, "--fabric", "nvlink9"], "nvlink9", "nvlink4"),
    Case("smoke-zero-7", ["smoke", *INV, "--zero", "7"], "7", "1, 2, 3"),
    Case("smoke-zero-list-bad", ["smoke", *INV, "--zero", "1,x"], "x", "1, 2, 3"),
    Case("smoke-zero-unicode", ["smoke", *INV, "--zero", "²"], "²", "1, 2, 3"),
    Case("smoke-offload-typo", ["smoke", *INV, "--offload", "gpu"], "gpu", "cpu"),
    Case("smoke-launcher-typo", ["smoke", *INV, "--launcher", "pdsh"], "pdsh", "torchrun"),
    Case("smoke-timeout-negative", ["smoke", *INV, "--timeout", "-5"], "--timeout -5", "from 1"),
    Case(
        "smoke-ds-config-missing",
        ["smoke", *INV, "--ds-config", "nope.json"],
        "nope.json",
        "existing file",
    ),
    Case("smoke-ds-config-dir", ["smoke", *INV, "--ds-config", "adir"], "adir", "give a file"),
    Case(
        "smoke-ds-config-not-json",
        ["smoke", *INV, "--ds-config", "existing.txt"],
        "existing.txt",
        "dscluster dsconfig",
    ),
    Case(
        "smoke-ds-config-not-utf8",
        ["smoke", *INV, "--ds-config", "bad.json"],
        "bad.json",
        "UTF-8",
        setup=_write("bad.json", b'{"a": "\xff"}'),
    ),
    Case(
        "smoke-ds-config-list",
        ["smoke", *INV, "--ds-config", "list.json"],
        "list.json",
        "dscluster dsconfig",
        setup=_write("list.json", b"[1, 2]"),
    ),
    Case(
        "smoke-ds-config-and-offload",
        ["smoke", *INV, "--ds-config", "ds_config.json", "--offload", "cpu"],
        "--offload cpu",
        "drop --offload",
    ),
    *_ports(["smoke", *INV], [], "smoke"),
    *(
        Case(
            f"{command}-exclude-unhealthy-no-doctor",
            [command, *INV, "--no-doctor", "--exclude-unhealthy", *tail],
            "--exclude-unhealthy",
            "drop one of them",
        )
        for command, tail in (("smoke", []), ("launch", RUN))
    ),
    # launch
    Case("launch-no-script", ["launch", *INV], "no script", "put it after '--'"),
    Case("launch-script-missing", ["launch", *INV, "--", "nope.py"], "nope.py", "--no-stage"),
    Case("launch-script-dir", ["launch", *INV, "--", "adir"], "adir", "--no-stage"),
    Case(
        "launch-no-stage-relative",
        ["launch", *INV, "--no-stage", "--", "train.py"],
        "train.py",
        "absolute path",
    ),
    Case(
        "launch-unsafe-subshell",
        ["launch", *INV, *RUN, "$(touch pwned)"],
        "$(touch pwned)",
        "--launcher torchrun",
    ),
    Case("launch-unsafe-backtick", ["launch", *INV, *RUN, "`id`"], "`id`", "--launcher torchrun"),
    Case("launch-unsafe-quote", ["launch", *INV, *RUN, "it's"], "it's", "--launcher torchrun"),
    Case("launch-unsafe-semicolon", ["launch", *INV, *RUN, "a;b"], "a;b", "move the value"),
    Case(
        "launch-include-empty-host", ["launch", *INV, "--include", "@n1", *RUN], "@n1", "NAME[:SLOT"
    ),
    Case(
        "launch-include-bad-slot", ["launch", *INV, "--include", "n1:x", *RUN], "n1:x", "NAME:0,1"
    ),
    Case(
        "launch-include-neg-slot", ["launch", *INV, "--include", "n1:-1", *RUN], "n1:-1", "NAME:0,1"
    ),
    Case(
        "launch-include-huge-slot",
        ["launch", *INV, "--include", "n1:99999", *RUN],
        "99999",
        "slots count from 0",
    ),
    Case(
        "launch-exclude-two-colons",
        ["launch", *INV, "--exclude", "n1:0:1", *RUN],
        "n1:0:1",
        "NAME[:SLOT",
    ),
    Case(
        "launch-num-nodes-zero",
        ["launch", *INV, "--num-nodes", "0", *RUN],
        "--num-nodes 0",
        "from 1",
    ),
    Case(
        "launch-num-gpus-word",
        ["launch", *INV, "--num-gpus", "all", *RUN],
        "--num-gpus all",
        "e.g. 1",
    ),
    Case(
        "launch-timeout-negative",
        ["launch", *INV, "--timeout", "-5", *RUN],
        "--timeout -5",
        "from 1",
    ),
    Case(
        "launch-launcher-typo",
        ["launch", *INV, "--launcher", "mpirun", *RUN],
        "mpirun",
        "deepspeed",
    ),
    Case(
        "launch-dry-run-bad-script",
        ["launch", *INV, "--dry-run", "--", "nope.py"],
        "nope.py",
        "--no-stage",
    ),
    *_ports(["launch", *INV], RUN, "launch"),
    # launch: the ecosystems' modes (issue 15)
    *_mode_cases(["launch", *INV], "launch"),
    Case(
        "launch-gaudi-spawn-other-launcher",
        ["launch", *INV, "--launcher", "torchrun", "--gaudi-spawn", "train.py", *RUN],
        "--gaudi-spawn",
        "--launcher gaudi_spawn",
    ),
    Case(
        "launch-gaudi-spawn-missing",
        ["launch", *INV, "--launcher", "gaudi_spawn", *RUN],
        "--launcher gaudi_spawn",
        "--gaudi-spawn PATH",
    ),
    Case(
        "launch-gaudi-spawn-not-here-relative",
        ["launch", *INV, "--launcher", "gaudi_spawn", "--gaudi-spawn", "nope.py", *RUN],
        "nope.py",
        "absolute path on the nodes",
    ),
    Case(
        "launch-gaudi-spawn-unsafe-arg",
        ["launch", *INV, "--launcher", "gaudi_spawn", "--gaudi-spawn", "/opt/g.py", *RUN, "a;b"],
        "a;b",
        "--launcher torchrun",
    ),
    # doctor
    Case(
        "doctor-shm-negative", ["doctor", *INV, "--min-shm-gb", "-1"], "--min-shm-gb -1", "from 0"
    ),
    Case("doctor-shm-nan", ["doctor", *INV, "--min-shm-gb", "nan"], "nan", "e.g. 1"),
    Case("doctor-free-word", ["doctor", *INV, "--min-free-gb", "lots"], "lots", "e.g. 2"),
    *_ports(["doctor", *INV], [], "doctor"),
    # dsconfig
    Case("dsconfig-lr-negative", ["dsconfig", *INV, "--lr", "-1"], "--lr -1", "above 0"),
    Case("dsconfig-lr-nan", ["dsconfig", *INV, "--lr", "nan"], "--lr nan", "e.g. 1e-4"),
    Case("dsconfig-lr-zero", ["dsconfig", *INV, "--lr", "0"], "--lr 0", "above 0"),
    Case(
        "dsconfig-micro-batch-zero",
        ["dsconfig", *INV, "--micro-batch", "0"],
        "--micro-batch 0",
        "from 1",
    ),
    Case(
        "dsconfig-grad-accum-word",
        ["dsconfig", *INV, "--grad-accum", "x"],
        "--grad-accum x",
        "e.g. 1",
    ),
    Case(
        "dsconfig-buffer-negative",
        ["dsconfig", *INV, "--nvme-buffer-size", "-2"],
        "--nvme-buffer-size -2",
        "from 1",
    ),
    Case("dsconfig-zero-list", ["dsconfig", *INV, "--zero", "1,2"], "--zero 1,2", "one per stage"),
    Case(
        "dsconfig-nvme-path-without-nvme",
        ["dsconfig", *INV, "--nvme-path", "/nvme"],
        "/nvme",
        "--offload nvme",
    ),
    Case(
        "dsconfig-nvme-path-relative",
        ["dsconfig", *INV, "--zero", "3", "--offload", "nvme", "--nvme-path", "nvme"],
        "nvme",
        "e.g. --nvme-path /local_nvme",
    ),
    Case("dsconfig-out-dir", ["dsconfig", *INV, "-o", "adir"], "adir", "give a file path"),
    Case(
        "dsconfig-out-under-file",
        ["dsconfig", *INV, "-o", "existing.txt/x.json"],
        "existing.txt",
        "choose another path",
    ),
    Case("dsconfig-precision-typo", ["dsconfig", *INV, "--precision", "fp8"], "fp8", "bf16"),
    # sbatch
    Case(
        "sbatch-nodes-zero",
        ["sbatch", "--launcher", "srun", "--nodes", "0", *RUN],
        "--nodes 0",
        "from 1",
    ),
    Case(
        "sbatch-time-newline",
        ["sbatch", "--launcher", "srun", "--time", "30\n", *RUN],
        "30",
        "D-HH:MM:SS",
    ),
    Case(
        "sbatch-time-words",
        ["sbatch", "--launcher", "srun", "--time", "ten minutes", *RUN],
        "ten minutes",
        "HH:MM:SS",
    ),
    Case(
        "sbatch-chdir-newline",
        ["sbatch", "--launcher", "srun", "--chdir", "/x\n", *RUN],
        "--chdir",
        "plain value",
    ),
    Case(
        "sbatch-chdir-relative",
        ["sbatch", "--launcher", "srun", "--chdir", "jobs", *RUN],
        "jobs",
        "absolute path",
    ),
    Case(
        "sbatch-job-name-blank",
        ["sbatch", "--launcher", "srun", "--job-name", "a b", *RUN],
        "a b",
        "plain value",
    ),
    Case(
        "sbatch-partition-shell",
        ["sbatch", "--launcher", "srun", "--partition", "p;rm", *RUN],
        "p;rm",
        "plain value",
    ),
    Case(
        "sbatch-venv-relative",
        ["sbatch", "--launcher", "srun", "--venv", "venv", *RUN],
        "venv",
        "absolute path",
    ),
    Case(
        "sbatch-deepspeed-subshell",
        ["sbatch", "--launcher", "deepspeed", *RUN, "$(id)"],
        "$(id)",
        "--launcher torchrun",
    ),
    Case(
        "sbatch-mode-deepspeed-backtick",
        ["sbatch", "--mode", "deepspeed", *RUN, "`id`"],
        "`id`",
        "--launcher torchrun",
    ),
    Case(
        "sbatch-out-dir",
        ["sbatch", "--launcher", "srun", "-o", "adir", *RUN],
        "adir",
        "give a file path",
    ),
    Case("sbatch-no-launcher", ["sbatch", *RUN], "--launcher", "--help"),
    Case(
        "sbatch-slots-zero",
        ["sbatch", "--launcher", "srun", "--slots", "0", *RUN],
        "--slots 0",
        "from 1",
    ),
    Case(
        "sbatch-env-not-utf8",
        ["sbatch", "--launcher", "srun", *INV, *RUN],
        ".deepspeed_env",
        "UTF-8",
        setup=_write("inventories/demo/.deepspeed_env", b"A=\xff\xfe\n"),
    ),
    *_ports(["sbatch", "--launcher", "torchrun"], RUN, "sbatch"),
    *_mode_cases(["sbatch"], "sbatch"),
    Case(
        "sbatch-accelerate-fsdp-on-cpu",
        ["sbatch", "--launcher", "accelerate", "--accelerate-config-kind", "fsdp", *RUN],
        "--accelerate-config-kind fsdp",
        "--accelerate-config-kind ddp",
    ),
    # launch --workdir
    Case(
        "launch-workdir-file",
        ["launch", *INV, "--workdir", "train.py", *RUN],
        "--workdir train.py",
        "--workdir .",
    ),
    Case(
        "launch-workdir-script-outside",
        ["launch", *INV, "--workdir", "adir", "--", "../train.py"],
        "../train.py",
        "relative to the directory",
    ),
    Case(
        "launch-workdir-job-file",
        ["launch", *INV, "--workdir", "adir", "--", "inside.txt"],
        "launch.sh",
        "rename it",
        setup=_write("adir/launch.sh", b"#!/bin/sh\n"),
    ),
    Case(
        "launch-workdir-link-out",
        ["launch", *INV, "--workdir", "adir", "--", "inside.txt"],
        "leak",
        "copy the file in",
        setup=_link("adir/leak", "../train.py"),
    ),
    Case(
        "launch-workdir-no-stage",
        ["launch", *INV, "--workdir", "adir", "--no-stage", "--", "/opt/inside.txt"],
        "--no-stage",
        "give one of them",
    ),
    # dsconfig --hf, and the HF form's "auto" where the smoke job reads a config
    Case(
        "dsconfig-hf-micro-batch",
        ["dsconfig", *INV, "--hf", "--micro-batch", "4"],
        "--micro-batch",
        "--per_device_train_batch_size",
    ),
    Case(
        "dsconfig-hf-lr",
        ["dsconfig", *INV, "--hf", "--lr", "1e-5"],
        "--lr",
        "--learning_rate",
    ),
    Case(
        "smoke-ds-config-auto",
        ["smoke", *INV, "--ds-config", "hf.json"],
        "train_batch_size",
        "without --hf",
        setup=_write("hf.json", b'{"train_batch_size": "auto", "zero_optimization": {"stage": 2}}'),
    ),
]
