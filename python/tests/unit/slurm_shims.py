"""Recording shims of scontrol / srun / pdsh, a venv with recording torchrun / deepspeed /
accelerate, and helpers that write and submit a batch script against them."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import hostlist

from dscluster.sources import slurm

from .clirun import run_cli

# ---- shims: scontrol, srun, pdsh and a venv with recording torchrun / deepspeed -----------

SCONTROL = """\
import os, sys
import hostlist
args = sys.argv[1:]
if args[:2] != ["show", "hostnames"]:
    sys.exit("scontrol shim: only 'show hostnames'")
if "SHIM_NODES" in os.environ and len(args) == 2:
    print("\\n".join(os.environ["SHIM_NODES"].split()))
    sys.exit(0)
nodelist = args[2] if len(args) > 2 else os.environ.get("SLURM_JOB_NODELIST")
if not nodelist:
    sys.exit("scontrol: error: host list is empty")
print("\\n".join(hostlist.expand_hostlist(nodelist)))
"""

# Records its options, checks they are consistent the way Slurm does, then runs the command
# once per task locally with the ids Slurm would give it.
SRUN = """\
import json, os, subprocess, sys
import hostlist
argv = sys.argv[1:]
opts = {}
while argv and argv[0].startswith("--"):
    key, _, value = argv.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["SHIM_LOG"] + "/srun.jsonl", "a") as fh:
    fh.write(json.dumps({"opts": opts, "command": argv}) + "\\n")
nodes = hostlist.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
n, ntasks, per = int(opts["nodes"]), int(opts["ntasks"]), int(opts["ntasks-per-node"])
assert n == len(nodes) and ntasks == n * per, (opts, nodes)
assert "overcommit" in opts or int(opts["cpus-per-task"]) * per <= int(os.environ["SHIM_CPUS"])
rc = 0
for node_id, node in enumerate(nodes):
    for local in range(per):
        env = dict(os.environ, SLURM_PROCID=str(node_id * per + local), SLURM_NTASKS=str(ntasks),
                   SLURM_LOCALID=str(local), SLURM_NODEID=str(node_id), SLURMD_NODENAME=node)
        rc = max(rc, subprocess.run(argv, env=env).returncode)
sys.exit(rc)
"""

# torchrun: records its arguments, then starts --nproc-per-node ranks as torchrun would.
TORCHRUN = """\
import json, os, subprocess, sys
argv = sys.argv[1:]
opts = {}
while argv and argv[0].startswith("--"):
    key, _, value = argv.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["SHIM_LOG"] + "/torchrun.jsonl", "a") as fh:
    fh.write(json.dumps({"opts": opts, "node": os.environ["SLURMD_NODENAME"]}) + "\\n")
nproc, node = int(opts["nproc-per-node"]), int(os.environ["SLURM_NODEID"])
for local in range(nproc):
    env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local),
               WORLD_SIZE=str(int(opts["nnodes"]) * nproc))
    subprocess.run([sys.executable, "-u", *argv], env=env, check=True)
"""

# deepspeed: reads the hostfile and DS_ENV_FILE exactly as DeepSpeed's runner does, records.
DEEPSPEED = """\
import json, os, re, subprocess, sys
argv = sys.argv[1:]
hostfile = argv[argv.index("--hostfile") + 1]
pool = {}
for line in open(hostfile):
    m = re.search(r"^(\\S+)\\s+slots=(\\d+)", line)
    assert m and m.group(1) not in pool, line
    pool[m.group(1)] = int(m.group(2))
name = os.getenv("DS_ENV_FILE", ".deepspeed_env")
exports = {}
for var in open(name).readlines():
    key, val = var.split("=", maxsplit=1)
    exports[key.strip()] = val.strip()
record = {"argv": argv, "cwd": os.getcwd(), "pool": pool, "exports": exports,
          "hostfile": hostfile, "PDSH_RCMD_TYPE": os.environ.get("PDSH_RCMD_TYPE"),
          "PATH": os.environ["PATH"], "MASTER_ADDR": os.environ.get("MASTER_ADDR")}
with open(os.environ["SHIM_LOG"] + "/deepspeed.json", "w") as fh:
    json.dump(record, fh)
# As DeepSpeed's launch.py under --no_python: every rank runs the wrapper with its variables,
# --local_rank=N right after it (the batch step's own environment stands in for the node's).
if "--no_python" in argv:
    i = argv.index("--no_python")
    wrapper, program = argv[i + 1], argv[i + 2:]
    world, first = sum(pool.values()), 0
    for node_rank, slots in enumerate(pool.values()):
        for local in range(slots):
            env = dict(os.environ, **exports, RANK=str(first + local), LOCAL_RANK=str(local),
                       WORLD_SIZE=str(world), CROSS_RANK=str(node_rank),
                       CROSS_SIZE=str(len(pool)), LOCAL_SIZE=str(slots))
            subprocess.run([wrapper, f"--local_rank={local}", *program], env=env, check=True)
        first += slots
"""

# accelerate: records its arguments and the config its node wrote, then starts
# num_processes / num_machines ranks with torch.distributed.run's variables.
ACCELERATE = """\
import json, os, subprocess, sys
argv = sys.argv[1:]
assert argv.pop(0) == "launch", argv
opts, flags = {}, []
while argv and argv[0].startswith("--"):
    key = argv.pop(0)[2:]
    if key in ("same_network", "multi_gpu"):
        flags.append(key)
    else:
        opts[key] = argv.pop(0)
record = {"opts": opts, "flags": flags, "node": os.environ["SLURMD_NODENAME"],
          "config": open(opts["config_file"]).read()}
with open(os.environ["SHIM_LOG"] + "/accelerate.jsonl", "a") as fh:
    fh.write(json.dumps(record) + "\\n")
nodes, total = int(opts["num_machines"]), int(opts["num_processes"])
nproc, node = total // nodes, int(opts["machine_rank"])
for local in range(nproc):
    env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local),
               WORLD_SIZE=str(total), GROUP_RANK=str(node), LOCAL_WORLD_SIZE=str(nproc),
               MASTER_ADDR=opts["main_process_ip"], MASTER_PORT=opts["main_process_port"])
    subprocess.run([sys.executable, "-u", *argv], env=env, check=True)
"""

JOB = """\
import json, os, sys
out = sys.argv[sys.argv.index("--out") + 1]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "FROM_INVENTORY", "PYTHONUNBUFFERED", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID",
        "DSCLUSTER_RESTART", "DSCLUSTER_CHECKPOINT_DIR", "DSCLUSTER_CHECKPOINT_TAG")
record = {k: os.environ.get(k) for k in keys}
record["argv"] = sys.argv[1:]
record["path0"] = os.environ["PATH"].split(":")[0]
os.makedirs(out, exist_ok=True)
if os.environ.get("FAIL_RANK") == record["RANK"]:
    sys.exit(3)
with open(os.path.join(out, f"rank{record['RANK']}.json"), "w") as fh:
    json.dump(record, fh)
"""


def _script(path: pathlib.Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def make_shims(tmp_path: pathlib.Path) -> pathlib.Path:
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    _script(shims / "scontrol", SCONTROL)
    _script(shims / "srun", SRUN)
    (shims / "pdsh").write_text("#!/bin/sh\nexit 0\n")
    (shims / "pdsh").chmod(0o755)
    return shims


def make_venv(tmp_path: pathlib.Path) -> pathlib.Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    _script(venv / "bin" / "torchrun", TORCHRUN)
    _script(venv / "bin" / "deepspeed", DEEPSPEED)
    _script(venv / "bin" / "accelerate", ACCELERATE)
    return venv


USER_ARGS = ["job.py", "--out", "ranks dir", "--note", 'it\'s "quoted" $HOME `x`']
# The deepspeed launcher hands arguments to a remote shell (pdsh): only plain words pass, and
# USER_ARGS is refused there (test_sbatch_deepspeed_refuses_shell_characters).
DEEPSPEED_USER_ARGS = ["job.py", "--out", "ranks dir", "--note", "plain, value=1 @x:y/z"]


def user_args(mode: str) -> list[str]:
    return DEEPSPEED_USER_ARGS if mode == "deepspeed" else USER_ARGS


def submit(
    tmp_path: pathlib.Path, script: pathlib.Path, *, nodelist="n[1-2]", cpus="4(x2)", extra=None
) -> subprocess.CompletedProcess[str]:
    """Run the batch script as sbatch would on the first node: Slurm's variables, submit dir."""
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir(exist_ok=True)
    (submit_dir / "job.py").write_text(JOB)
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    env = {
        "PATH": f"{tmp_path / 'shims'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(hostlist.expand_hostlist(nodelist))),
        "SLURM_JOB_CPUS_PER_NODE": cpus,
        "SLURM_SUBMIT_DIR": str(submit_dir),
        "SHIM_LOG": str(log),
        "SHIM_CPUS": str(min(slurm.parse_cpus_per_node(cpus))),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        **(extra or {}),
    }
    return subprocess.run(
        ["bash", str(script)],
        cwd=submit_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ranks(tmp_path: pathlib.Path) -> list[dict]:
    files = sorted((tmp_path / "submit" / "ranks dir").glob("rank*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: int(r["RANK"]))


def write_script(tmp_path: pathlib.Path, mode: str, *extra: str) -> pathlib.Path:
    venv = make_venv(tmp_path) if not (tmp_path / "venv").exists() else tmp_path / "venv"
    make_shims(tmp_path)
    script = tmp_path / f"{mode}.sbatch"
    rc, out, err = run_cli(
        "sbatch",
        "--launcher",
        mode,
        "--venv",
        str(venv),
        "-o",
        str(script),
        *extra,
        "--",
        *user_args(mode),
    )
    assert rc == 0, err
    assert out.strip() == str(script)
    assert script.stat().st_mode & 0o777 == 0o755
    syntax = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    return script


def sbatch_lines(script: pathlib.Path) -> list[str]:
    return [ln for ln in script.read_text().splitlines() if ln.startswith("#SBATCH")]
