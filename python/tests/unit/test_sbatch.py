"""`dscluster sbatch`: the batch scripts run by bash against recording shims of scontrol /
srun / torchrun / deepspeed; old flag spellings beside the new."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import textwrap

import pytest

from dscluster import inventory, sbatch
from dscluster.errors import DsclusterError

from .clirun import one_line_error, run_cli, run_main
from .slurm_shims import (
    DEEPSPEED_USER_ARGS,
    USER_ARGS,
    make_shims,
    make_venv,
    ranks,
    sbatch_lines,
    submit,
    write_script,
)

# ---- dscluster sbatch ---------------------------------------------------------------------


def test_sbatch_header_as_given(tmp_path):
    script = write_script(
        tmp_path,
        "torchrun",
        "--nodes", "2", "--slots", "2", "--partition", "debug", "--time", "0:10:00",
        "--job-name", "smoke", "--slurm-output", "slurm-%j.out", "--chdir", "/shared/jobs",
    )  # fmt: skip
    assert sbatch_lines(script) == [
        "#SBATCH --job-name=smoke",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --partition=debug",
        "#SBATCH --time=0:10:00",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --chdir=/shared/jobs",
    ]
    assert script.read_text().startswith("#!/bin/bash\n#SBATCH")
    assert "gpus-per-node" not in script.read_text()


def test_sbatch_minimal_header(tmp_path):
    script = write_script(tmp_path, "srun")
    assert sbatch_lines(script) == []
    assert "set -euo pipefail" in script.read_text()


def test_sbatch_srun_mode_one_task_per_slot(tmp_path):
    script = write_script(tmp_path, "srun", "--slots", "2", "--master-port", "29611")
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"] == {
        "nodes": "2",
        "ntasks": "4",
        "ntasks-per-node": "2",
        "cpus-per-task": "2",
        "kill-on-bad-exit": "1",
    }
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {r["WORLD_SIZE"] for r in got} == {"4"}
    assert [r["LOCAL_RANK"] for r in got] == ["0", "1", "0", "1"]
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"], r["LOCAL_WORLD_SIZE"]) for r in got} == {
        ("n1", "29611", "2")
    }
    assert {tuple(r["argv"]) for r in got} == {tuple(USER_ARGS[1:])}  # quoting kept
    assert got[0]["path0"] == str(tmp_path / "venv" / "bin")
    assert "n1 n2" in proc.stdout


def test_sbatch_srun_mode_gpus_on_node_win(tmp_path):
    script = write_script(tmp_path, "srun", "--slots", "1")
    proc = submit(tmp_path, script, nodelist="g[01-03]", cpus="8(x3)",
                  extra={"SLURM_GPUS_ON_NODE": "2"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = ranks(tmp_path)
    assert len(got) == 6 and {r["WORLD_SIZE"] for r in got} == {"6"}
    assert {r["MASTER_ADDR"] for r in got} == {"g01"}
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert "overcommit" not in call["opts"] and call["opts"]["cpus-per-task"] == "4"


def test_sbatch_srun_mode_more_gpus_than_cpus_overcommits(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = submit(tmp_path, script, cpus="2(x2)", extra={"SLURM_GPUS_ON_NODE": "4"})
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"]["overcommit"] == "" and call["opts"]["cpus-per-task"] == "1"
    assert len(ranks(tmp_path)) == 8


def test_sbatch_torchrun_mode(tmp_path):
    script = write_script(tmp_path, "torchrun", "--slots", "2", "--master-port", "29400")
    proc = submit(tmp_path, script, nodelist="n[1-2]", cpus="2(x2)")
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"] == {
        "nodes": "2",
        "ntasks": "2",
        "ntasks-per-node": "1",
        "cpus-per-task": "2",
        "kill-on-bad-exit": "1",
    }
    assert call["command"][0] == str(tmp_path / "venv" / "bin" / "torchrun")
    agents = [
        json.loads(ln) for ln in (tmp_path / "log" / "torchrun.jsonl").read_text().splitlines()
    ]
    assert [a["node"] for a in agents] == ["n1", "n2"]
    assert {json.dumps(a["opts"], sort_keys=True) for a in agents} == {
        json.dumps(
            {
                "nnodes": "2",
                "nproc-per-node": "2",
                "rdzv-backend": "c10d",
                "rdzv-endpoint": "n1:29400",
                "rdzv-id": "42",
            },
            sort_keys=True,
        )
    }
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {tuple(r["argv"]) for r in got} == {tuple(USER_ARGS[1:])}


def test_sbatch_deepspeed_mode(tmp_path):
    script = write_script(tmp_path, "deepspeed", "--slots", "3", "--master-port", "29555")
    proc = submit(tmp_path, script, nodelist="w[1-3]", cpus="3(x3)", extra={"SLURM_PROCID": "0"})
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    submit_dir = tmp_path / "submit"
    assert rec["argv"] == [
        "--hostfile", f"{submit_dir}/hostfile.42", "--launcher", "pdsh",
        "--master_addr", "w1", "--master_port", "29555",
        "--no_python", f"{submit_dir}/ds_rank.42.sh", *DEEPSPEED_USER_ARGS,
    ]  # fmt: skip
    assert rec["pool"] == {"w1": 3, "w2": 3, "w3": 3}
    assert rec["cwd"] == str(submit_dir)
    assert rec["PDSH_RCMD_TYPE"] == "ssh"
    assert rec["exports"]["PATH"].startswith(f"{tmp_path / 'venv'}/bin:")
    assert rec["exports"]["PYTHONUNBUFFERED"] == "1"
    assert rec["PATH"].split(":")[0] == f"{tmp_path / 'venv'}/bin"
    assert (submit_dir / "deepspeed_env.42").is_file()
    # every rank ran through the wrapper: Lightning's node rank, not Slurm's task ids
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == [str(i) for i in range(9)]
    assert [r["NODE_RANK"] for r in got] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert {(r["GROUP_RANK"] == r["NODE_RANK"], r["LOCAL_WORLD_SIZE"]) for r in got} == {
        (True, "3")
    }
    assert {r["SLURM_PROCID"] for r in got} == {None}
    # DeepSpeed's --local_rank=N lands right behind the script, as without --no_python
    assert got[4]["argv"] == ["--local_rank=1", *DEEPSPEED_USER_ARGS[1:]]


@pytest.mark.parametrize("bad", ["$(rm -rf ~)", "`id`", 'it\'s "quoted"', "a;b", "$HOME"])
def test_sbatch_deepspeed_refuses_shell_characters(tmp_path, bad):
    """As launch: the deepspeed launcher passes arguments to the remote shell unquoted, so an
    argument with shell characters is refused (exit 2), nothing written; the other modes pass
    arguments exactly (USER_ARGS above)."""
    script = tmp_path / "ds.sbatch"
    line = one_line_error(
        run_main("sbatch", "--launcher", "deepspeed", "-o", str(script), "--", "job.py", bad), rc=2
    )
    assert repr(bad) in line and "--launcher torchrun" in line
    assert not script.exists()


def test_sbatch_deepspeed_mode_gpus_and_chdir(tmp_path):
    jobs = tmp_path / "jobs"
    script = write_script(tmp_path, "deepspeed", "--chdir", str(jobs))
    jobs.mkdir()
    proc = submit(tmp_path, script, extra={"SLURM_GPUS_ON_NODE": "8"})
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    assert rec["pool"] == {"n1": 8, "n2": 8}
    assert rec["hostfile"] == f"{jobs}/hostfile.42"


def test_sbatch_script_refuses_outside_a_job(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = subprocess.run(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "submit this script with sbatch" in proc.stderr


def test_sbatch_fails_without_scontrol(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = submit(tmp_path, script, extra={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0  # the prelude fails instead of guessing the nodes
    assert not (tmp_path / "log" / "srun.jsonl").exists()


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_sbatch_rank_failure_fails_the_job(tmp_path, mode):
    script = write_script(tmp_path, mode, "--slots", "2")
    proc = submit(tmp_path, script, extra={"FAIL_RANK": "2"})
    assert proc.returncode != 0


def write_inventory(tmp_path: pathlib.Path, venv: pathlib.Path) -> pathlib.Path:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            f"""\
            all:
              vars:
                dscluster_venv: {venv}
                dscluster_master_port: 29777
              children:
                head:
                  hosts:
                    n1: {{}}
                workers:
                  hosts:
                    n2: {{}}
            """
        )
    )
    (inv / ".deepspeed_env").write_text(
        f"PATH={venv}/bin:/usr/bin:/bin\nFROM_INVENTORY=a b,c@d\nOMP_NUM_THREADS=2\n"
    )
    return inv


def test_sbatch_takes_defaults_and_env_from_inventory(tmp_path):
    venv = make_venv(tmp_path)
    make_shims(tmp_path)
    inv = write_inventory(tmp_path, venv)
    script = tmp_path / "inv.sbatch"
    rc, _, err = run_cli(
        "sbatch", "--launcher", "srun", "-i", str(inv), "-o", str(script), "--", *USER_ARGS
    )
    assert rc == 0, err
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    got = ranks(tmp_path)
    assert {(r["MASTER_PORT"], r["FROM_INVENTORY"]) for r in got} == {("29777", "a b,c@d")}
    assert got[0]["path0"] == str(venv / "bin")

    script = tmp_path / "inv-ds.sbatch"
    rc, _, err = run_cli(
        "sbatch", "--mode", "deepspeed", "-i", str(inv), "--out", str(script), "--",
        *DEEPSPEED_USER_ARGS,
    )  # fmt: skip
    assert rc == 0, err
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    assert rec["exports"] == {
        "PATH": f"{venv}/bin:/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "FROM_INVENTORY": "a b,c@d",
        "OMP_NUM_THREADS": "2",
    }
    assert "--master_port" in rec["argv"] and "29777" in rec["argv"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--launcher", "srun", "--nodes", "0"], "--nodes 0 is out of range"),
        (["--launcher", "srun", "--slots", "0"], "--slots 0 is out of range"),
        (["--launcher", "srun", "--master-port", "70000"], "--master-port 70000 is out of range"),
        (["--launcher", "srun", "--time", "ten minutes"], "is not a Slurm time"),
        (["--launcher", "srun", "--job-name", "a b"], "has blanks, quotes or shell characters"),
        (["--launcher", "srun", "--partition", "p;rm"], "has blanks, quotes or shell characters"),
        (["--launcher", "srun", "--venv", "venv"], "is not an absolute path"),
        (["--launcher", "srun", "--slurm-output", "a b"], "has blanks, quotes or shell"),
        # the old spellings (hidden aliases) still parse; errors name today's flag
        (["--mode", "srun", "--nodes", "0"], "--nodes 0 is out of range"),
        (["--mode", "srun", "--slots-per-node", "0"], "--slots 0 is out of range"),
        (["--mode", "srun", "--cpu-slots", "0"], "--slots 0 is out of range"),
        (["--mode", "srun", "--port", "70000"], "--master-port 70000 is out of range"),
        (["--mode", "srun", "--output", "a b"], "--slurm-output 'a b' has blanks"),
    ],
)
def test_sbatch_errors_one_line_nothing_written(tmp_path, argv, needle):
    """Refused before anything is read or written: exit 2."""
    script = tmp_path / "x.sbatch"
    line = one_line_error(run_main("sbatch", *argv, "-o", str(script), "--", "job.py"), rc=2)
    assert needle in line
    assert not script.exists()


@pytest.mark.parametrize("flag", ["--launcher", "--mode"])
def test_sbatch_launcher_is_one_of_its_choices(tmp_path, capsys, flag):
    """An unknown launcher is a usage error (exit 2) naming the choices, nothing written;
    render_sbatch refuses one too, in one line."""
    script = tmp_path / "x.sbatch"
    with pytest.raises(SystemExit) as exit_:
        run_cli("sbatch", flag, "mpirun", "-o", str(script), "--", "job.py")
    assert exit_.value.code == 2
    assert "invalid choice: 'mpirun'" in capsys.readouterr().err
    assert not script.exists()
    with pytest.raises(SystemExit) as exit_:
        run_cli("sbatch", "-o", str(script), "--", "job.py")
    assert exit_.value.code == 2
    assert "required: --launcher" in capsys.readouterr().err
    with pytest.raises(DsclusterError, match="--launcher 'mpirun' is not a launch mode"):
        sbatch.render_sbatch(sbatch.SbatchOptions(launcher="mpirun", command=["job.py"]))


def test_sbatch_old_spellings_write_the_same_script(tmp_path):
    """--mode, --slots-per-node, --port, --output and --script: the same script as today's
    --launcher, --slots, --master-port, --slurm-output and -o/--out."""
    venv = make_venv(tmp_path)
    new, old = tmp_path / "new.sbatch", tmp_path / "old.sbatch"
    common = ["--venv", str(venv), "--nodes", "2"]
    assert run_cli(
        "sbatch", "--launcher", "torchrun", "--slots", "2", "--master-port", "29400",
        "--slurm-output", "s-%j.out", *common, "--out", str(new), "--", *USER_ARGS,
    )[0] == 0  # fmt: skip
    assert run_cli(
        "sbatch", "--mode", "torchrun", "--slots-per-node", "2", "--port", "29400",
        "--output", "s-%j.out", *common, "--script", str(old), "--", *USER_ARGS,
    )[0] == 0  # fmt: skip
    assert old.read_text() == new.read_text()
    assert "#SBATCH --output=s-%j.out" in new.read_text() and "PORT=29400" in new.read_text()


def test_sbatch_bad_inventory_env_is_one_line(tmp_path):
    venv = make_venv(tmp_path)
    inv = write_inventory(tmp_path, venv)
    (inv / ".deepspeed_env").write_text("PATH=/x\n# comment\n")
    script = tmp_path / "x.sbatch"
    line = one_line_error(
        run_cli("sbatch", "--launcher", "srun", "-i", str(inv), "-o", str(script), "--", "job.py")
    )
    assert "line 2 is not KEY=VALUE" in line
    assert not script.exists()


def test_render_sbatch_is_pure_and_quotes():
    opts = sbatch.SbatchOptions(launcher="torchrun", command=["t.py", "a b", "$(rm -rf /)"])
    text = sbatch.render_sbatch(opts)
    assert "t.py 'a b' '$(rm -rf /)'" in text
    assert f"VENV={sbatch.DEFAULT_VENV}" in text and f"PORT={inventory.DEFAULT_MASTER_PORT}" in text


# ---- --launcher accelerate ----------------------------------------------------------------


def accelerate_calls(tmp_path) -> list[dict]:
    lines = (tmp_path / "log" / "accelerate.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines]


def test_sbatch_accelerate_one_launch_per_node_seed_003s_form(tmp_path):
    script = write_script(tmp_path, "accelerate", "--slots", "2", "--master-port", "29612")
    proc = submit(tmp_path, script, extra={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    [srun] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert srun["opts"]["ntasks-per-node"] == "1" and srun["opts"]["ntasks"] == "2"
    calls = accelerate_calls(tmp_path)
    assert [(c["node"], c["opts"]["machine_rank"]) for c in calls] == [("n1", "0"), ("n2", "1")]
    for c in calls:
        assert c["opts"]["main_process_ip"] == "n1" and c["opts"]["main_process_port"] == "29612"
        assert (c["opts"]["num_machines"], c["opts"]["num_processes"]) == ("2", "4")
        assert c["opts"]["rdzv_backend"] == "static" and c["opts"]["max_restarts"] == "0"
        config_file = pathlib.Path(c["opts"]["config_file"])
        assert re.fullmatch(r"dscluster-accelerate\.42\.[A-Za-z0-9]{8}", config_file.parent.name)
        assert config_file.parent.parent == tmp_path and config_file.name == "config.yaml"
        # no --gres: a CPU cluster; MULTI_CPU gets --multi_gpu so every rank starts
        assert "multi_gpu" in c["flags"] and "same_network" in c["flags"]
        assert "distributed_type: MULTI_CPU" in c["config"]
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {tuple(r["argv"]) for r in got} == {tuple(USER_ARGS[1:])}  # quoting kept


def test_sbatch_accelerate_config_never_goes_through_a_predictable_path(tmp_path):
    """The rendered script makes each node's config in a fresh 0700 directory (mktemp -d)
    with noclobber; a link another user left at the old predictable path is not followed,
    and the nodes' configs are two private files, not one shared one."""
    text = sbatch.render_sbatch(
        sbatch.SbatchOptions(launcher="accelerate", command=["train.py"], venv="/opt/v")
    )
    assert 'mktemp -d "${TMPDIR:-/tmp}/dscluster-accelerate.$SLURM_JOB_ID.XXXXXXXX"' in text
    assert "(set -C; umask 077; printf" in text
    assert "dscluster-accelerate.$SLURM_JOB_ID.yaml" not in text
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    (tmp_path / "dscluster-accelerate.42.yaml").symlink_to(victim)
    script = write_script(tmp_path, "accelerate", "--slots", "2")
    proc = submit(tmp_path, script, extra={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "not yours\n"
    configs = {pathlib.Path(c["opts"]["config_file"]) for c in accelerate_calls(tmp_path)}
    assert len(configs) == 2  # one per node
    for config in configs:
        assert config.parent.stat().st_mode & 0o777 == 0o700
        assert config.stat().st_mode & 0o777 == 0o600
        assert not config.is_symlink() and "distributed_type: MULTI_CPU" in config.read_text()


def test_sbatch_accelerate_users_config_travels_exactly(tmp_path):
    config = tmp_path / "my.json"
    config.write_text('{"distributed_type": "MULTI_GPU", "note": "it\'s $HOME"}')
    script = write_script(tmp_path, "accelerate", "--accelerate-config", str(config))
    proc = submit(tmp_path, script, extra={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    calls = accelerate_calls(tmp_path)
    assert {c["config"] for c in calls} == {config.read_text() + "\n"}
    assert {pathlib.Path(c["opts"]["config_file"]).name for c in calls} == {"config.json"}
    assert all("multi_gpu" not in c["flags"] for c in calls)


def test_sbatch_accelerate_generated_kinds(tmp_path):
    fsdp = write_script(
        tmp_path, "accelerate", "--gres", "gpu:4", "--accelerate-config-kind", "fsdp"
    )
    text = fsdp.read_text()
    assert "distributed_type: FSDP" in text and "fsdp_sharding_strategy: FULL_SHARD" in text
    line = one_line_error(
        run_main("sbatch", "--launcher", "accelerate", "--accelerate-config-kind", "fsdp",
                 "-o", str(tmp_path / "x.sbatch"), "--", "job.py"),
        rc=2,
    )  # fmt: skip
    assert "CPU-only" in line and "--accelerate-config-kind ddp" in line


@pytest.mark.parametrize("mode", ["deepspeed", "torchrun", "srun", "accelerate"])
def test_sbatch_sources_the_nodes_secrets_file_and_holds_none(tmp_path, mode):
    """Job secrets reach the ranks from each node's own 0600 file (srun's tasks inherit the
    batch step's environment; ds_rank.sh reads it again where pdsh starts ranks): the batch
    script, which sbatch copies to the spool and `scontrol write batch_script` prints, holds
    none."""
    from dscluster.storage import SOURCE_SECRETS  # noqa: PLC0415

    extra = ("--accelerate-config-kind", "ddp") if mode == "accelerate" else ("--slots", "1")
    text = write_script(tmp_path, mode, *extra).read_text()
    assert text.count(SOURCE_SECRETS) == (2 if mode == "deepspeed" else 1)
