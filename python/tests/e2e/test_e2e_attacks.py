"""Attacks by the training user on the provisioned local cluster (SECURITY.md lists them).

Every job runs as `ds`, so `ds` is the attacker: it plants links, FIFOs and renamed trees where
root works, then a provision runs as it would. Each test asserts that root wrote nothing
through what was planted, that nothing root-only became readable by `ds`, and that the
provision refused in one line naming the node and the path. Everything planted is removed and
the cluster provisioned clean again in a finally, for the modules after this one.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
import yaml

from dscluster.jobs import SMOKE_JOB_FILES

from .e2e_cluster import NAME, docker, dsc

pytestmark = pytest.mark.docker

HEAD, N2, N3 = (f"{NAME}-n{i}" for i in range(1, 4))


def on(host: str, script: str, user: str = "root") -> subprocess.CompletedProcess[str]:
    argv = ["docker", "exec", "-u", user, f"dsc-{host}", "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def as_ds(host: str, script: str) -> None:
    proc = on(host, script, user="ds")
    assert proc.returncode == 0, f"{host} as ds: {script}: {proc.stderr}"


def state(host: str, *paths: str) -> str:
    """Owner, mode, link count and sha256 of each path (root's view), to compare after."""
    script = "for p in " + " ".join(paths) + '; do stat -c "%n %U:%G %a %h %F" "$p"; '
    script += 'if [ -f "$p" ]; then sha256sum "$p"; fi; done'
    proc = on(host, script)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def inventory_vars(inventory: pathlib.Path) -> dict:
    return yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["vars"]


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dscluster: error:")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return lines[0]


def test_links_and_fifos_in_ssh_dir_are_refused_and_nothing_is_followed(provisioned: pathlib.Path):
    """~/.ssh belongs to ds. ds points the files root writes there at root-only files (the
    issue's /etc/shadow, a host private key), replaces ~/.ssh itself with a link to root's, and
    leaves a FIFO where authorized_keys was (a read that never returns). The provision refuses
    on each node in one line; the targets are untouched and ds still cannot read them."""
    targets = {
        HEAD: "/etc/ssh/ssh_host_ed25519_key /etc/shadow",
        N2: "/etc/shadow /etc/ssh/ssh_host_ed25519_key",
        N3: "/root/.ssh /etc/shadow",
    }
    before = {host: state(host, paths) for host, paths in targets.items()}
    plants = [
        (HEAD, "~/.ssh/id_ed25519", "ln -s /etc/ssh/ssh_host_ed25519_key id_ed25519"),
        (N2, "~/.ssh/authorized_keys", "ln -s /etc/shadow authorized_keys"),
        (N3, "~/.ssh", None),
        (HEAD, "~/.ssh/authorized_keys", "mkfifo authorized_keys"),
        (N2, "~/.ssh/id_ed25519.pub", "ln -s /etc/shadow id_ed25519.pub"),
    ]
    try:
        for host, path, plant in plants:
            name = path.rsplit("/", 1)[1]
            if plant is None:  # ~/.ssh itself
                as_ds(host, "cd && mv .ssh .ssh.kept && ln -s /root/.ssh .ssh")
            else:
                as_ds(host, f"cd ~/.ssh && mv {name} {name}.kept && {plant}")
            proc = dsc("provision", "-i", str(provisioned), "--tags", "cluster_ssh", timeout=600)
            assert proc.returncode != 0
            line = error_line(proc)
            full = path.replace("~", "/home/ds")
            assert f"on {host}: cluster_ssh_files: {full} is " in line, line
            said = proc.stdout + proc.stderr
            assert "root:" not in said and "PRIVATE KEY" not in said  # nothing read out
            for target_host, paths in targets.items():
                assert state(target_host, paths) == before[target_host], (path, target_host)
                assert on(target_host, "cat /etc/shadow", user="ds").returncode != 0
            if plant is None:
                as_ds(host, "cd && rm .ssh && mv .ssh.kept .ssh")
            else:
                as_ds(host, f"cd ~/.ssh && rm {name} && mv {name}.kept {name}")
    finally:
        for host in (HEAD, N2, N3):  # whatever a failed round left, put back
            on(host, "cd ~ds && [ -L .ssh ] && rm .ssh && mv .ssh.kept .ssh", user="ds")
            on(host, "cd ~ds/.ssh && for f in *.kept; do [ -e \"$f\" ] || continue; "
               'rm -f "${f%.kept}"; mv "$f" "${f%.kept}"; done', user="ds")  # fmt: skip
    healed = dsc("provision", "-i", str(provisioned), "--tags", "cluster_ssh", timeout=600)
    assert healed.returncode == 0, healed.stdout[-3000:] + healed.stderr[-2000:]


def test_a_renamed_shared_tree_pointing_at_system_directories_is_refused(
    provisioned: pathlib.Path,
):
    """The shared tree's root as the old NFS default left it (the training user's, 2775): ds
    moves dscluster/ aside and puts links to /etc, /usr/local/lib and /root where jobs,
    wheelhouse and checkpoints were. The provision refuses in one line naming the shared
    directory; none of the targets changes owner or mode, no wheel lands in them. With the
    root made root's again (the new default) ds cannot rename dscluster/ at all."""
    system = "/etc /usr/local/lib /root"
    before = state(HEAD, system)
    assert on(HEAD, "mv /shared/dscluster /shared/x", user="ds").returncode != 0
    on(HEAD, "chown ds:ds /shared && chmod 2775 /shared")
    try:
        as_ds(
            HEAD,
            "cd /shared && mv dscluster dscluster.kept && mkdir dscluster && cd dscluster && "
            "ln -s /etc jobs && ln -s /usr/local/lib wheelhouse && ln -s /root checkpoints",
        )
        proc = dsc("provision", "-i", str(provisioned), "--tags", "ml_stack,launcher", timeout=900)
        assert proc.returncode != 0
        line = error_line(proc)
        assert "/shared belongs to ds" in line, line
        assert state(HEAD, system) == before
        assert on(HEAD, "ls /usr/local/lib/*.whl /etc/*.whl 2>/dev/null").stdout == ""
    finally:
        on(HEAD, "cd /shared && rm -rf dscluster && mv dscluster.kept dscluster")
        on(HEAD, "chown root:root /shared && chmod 0755 /shared")
    assert on(HEAD, "mv /shared/dscluster /shared/x", user="ds").returncode != 0
    assert on(HEAD, "touch /shared/dscluster/wheelhouse/x.whl", user="ds").returncode != 0
    healed = dsc("provision", "-i", str(provisioned), "--tags", "ml_stack,launcher", timeout=900)
    assert healed.returncode == 0, healed.stdout[-3000:] + healed.stderr[-2000:]
    assert docker("exec", f"dsc-{HEAD}", "stat", "-c", "%U %a", "/shared/dscluster").strip() == (
        "root 755"
    )


SECRET_JOB = """\
import hashlib, os, socket
digest = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
os.write(1, f"SECRET {socket.gethostname()} {digest}\\n".encode())
"""


def test_job_secrets_reach_every_rank_and_nowhere_else(
    provisioned: pathlib.Path, tmp_path: pathlib.Path
):
    """dscluster_secret_env: each node gets a 0600 file of the training user's in root's
    /var/lib/dscluster, every rank of a deepspeed launch reads the token from it, and the token
    is in no job file, no provision or launch output, no report, and not readable by another
    user. Emptied, the files are removed."""
    import hashlib  # noqa: PLC0415
    import json  # noqa: PLC0415

    token = "hf_e2e-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]
    path = provisioned / "group_vars" / "all.yml"
    before = path.read_text() if path.exists() else None
    data = (yaml.safe_load(before) if before else None) or {}
    path.parent.mkdir(exist_ok=True)
    path.write_text("---\n" + yaml.safe_dump(data | {"dscluster_secret_env": {"HF_TOKEN": token}}))
    hosts = (HEAD, N2, N3)
    try:
        prov = dsc("provision", "-i", str(provisioned), "--tags", "launcher", timeout=600)
        assert prov.returncode == 0, prov.stdout[-3000:] + prov.stderr[-2000:]
        assert token not in prov.stdout + prov.stderr
        for host in hosts:
            st = on(host, "stat -c '%U %a' /var/lib/dscluster/secrets.env").stdout.strip()
            assert st == "ds 600", (host, st)
            assert on(host, "cat /var/lib/dscluster/secrets.env", user="nobody").returncode != 0
        script = tmp_path / "secret_job.py"
        script.write_text(SECRET_JOB)
        proc = dsc(
            "launch", "-i", str(provisioned), "--launcher", "deepspeed", "--no-doctor",
            "--master-port", "29519", "--timeout", "120", "--", str(script), timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        said = proc.stdout + proc.stderr
        assert token not in said
        log = pathlib.Path(said.split("; log ", 1)[1].split(";", 1)[0]).read_text()
        assert token not in log
        want = hashlib.sha256(token.encode()).hexdigest()
        lines = [ln.split("SECRET ", 1)[1].split() for ln in log.splitlines() if "SECRET " in ln]
        seen = {words[0]: words[1] for words in lines}
        assert seen == dict.fromkeys(hosts, want), said[-3000:]
        # in no job file on the shared storage, and in no report or log on the controller
        leak = on(HEAD, f"grep -rlF -- {token} /shared/dscluster/jobs || true").stdout
        assert leak.strip() == ""
        for report in (provisioned / "reports").glob("*"):
            assert token not in report.read_text(errors="replace"), report
        assert token not in json.dumps([str(p) for p in provisioned.rglob("*")])
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
    prov = dsc("provision", "-i", str(provisioned), "--tags", "launcher", timeout=600)
    assert prov.returncode == 0, prov.stdout[-3000:] + prov.stderr[-2000:]
    for host in hosts:
        assert on(host, "test -e /var/lib/dscluster/secrets.env").returncode != 0, host


def test_a_replaced_wheel_with_its_lock_edited_to_match_is_copied_again(
    provisioned: pathlib.Path,
):
    """The node's wheel copy: ds cannot write it any more (root's all the way up); a wheel
    replaced there anyway (as an earlier version left it writable, simulated as root) with the
    node's lock.json and requirements.lock edited to match is found by its digest against the
    controller's lock and copied again, never installed: the venv is untouched."""
    import json  # noqa: PLC0415

    wheelhouse = "/shared/dscluster/wheelhouse"
    wheel = "annotated_types-0.8.0-py3-none-any.whl"
    assert on(HEAD, f"cp {wheelhouse}/{wheel} {wheelhouse}/x.whl", user="ds").returncode != 0
    facts = json.loads((provisioned / "facts" / f"{HEAD}.json").read_text())
    venv = facts["versions"]["venv"]
    installed = f"sha256sum {venv}/lib/python3*/site-packages/annotated_types/*.py"
    venv_before = on(HEAD, installed).stdout
    good = on(HEAD, f"sha256sum {wheelhouse}/{wheel}").stdout.split()[0]
    tamper = (
        f"cd {wheelhouse} && size=$(stat -c %s {wheel}) && "
        f"head -c $size /dev/urandom > {wheel} && new=$(sha256sum {wheel} | cut -d' ' -f1) && "
        f"sed -i s/{good}/$new/g lock.json requirements.lock && echo $new"
    )
    bad = on(HEAD, tamper).stdout.strip()
    assert bad and bad != good
    proc = dsc("provision", "-i", str(provisioned), "--tags", "ml_stack", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert on(HEAD, f"sha256sum {wheelhouse}/{wheel}").stdout.split()[0] == good
    assert on(
        HEAD, f"grep -c {bad} {wheelhouse}/lock.json {wheelhouse}/requirements.lock"
    ).stdout.split() == [
        f"{wheelhouse}/lock.json:0",
        f"{wheelhouse}/requirements.lock:0",
    ]
    assert on(HEAD, installed).stdout == venv_before


def test_a_copied_cluster_key_logs_in_only_from_the_cluster(
    provisioned: pathlib.Path, tmp_path: pathlib.Path
):
    """Any job can read the training user's cluster key. authorized_keys lets that key in only
    from the cluster's own addresses (from=), so a copy carried off a node, an image or a
    snapshot logs in nowhere: from the controller's side of the network it is refused, while
    the same key still logs in from node to node."""
    key = tmp_path / "stolen_ed25519"
    key.write_text(on(HEAD, "cat ~/.ssh/id_ed25519", user="ds").stdout)
    key.chmod(0o600)
    assert "PRIVATE KEY" in key.read_text()
    address = docker(
        "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", f"dsc-{N2}"
    ).split()[0]
    line = on(N2, "grep -F \"$(cut -d' ' -f1,2 ~ds/.ssh/id_ed25519.pub)\" ~ds/.ssh/authorized_keys")
    assert line.stdout.startswith('from="127.0.0.0/8,::1,') and address in line.stdout, line.stdout
    # The host keys local up pinned, checked as Ansible checks them: the refusal is the key's.
    known_hosts = pathlib.Path(inventory_vars(provisioned)["dscluster_state_dir"]) / "known_hosts"
    argv = [
        "ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "ConnectTimeout=10", "-F", "/dev/null", f"ds@{address}", "hostname",
    ]  # fmt: skip
    stolen = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert stolen.returncode == 255 and "Permission denied" in stolen.stderr, stolen.stderr
    inside = on(HEAD, f"ssh -o BatchMode=yes {N2} hostname", user="ds")
    assert inside.returncode == 0 and inside.stdout.strip() == N2, inside.stderr


def test_a_predictable_temp_dir_made_first_by_another_user_is_refused(
    provisioned: pathlib.Path, tmp_path: pathlib.Path
):
    """smoke_job's default --nvme-dir is /tmp/dscluster-nvme-<uid>, a name any local user can
    make first (here `nobody`, mode 0777, on one node) to read or swap what DeepSpeed pages out.
    The rank refuses to use it, the launch ends in one line naming that node and the path, and
    nothing is written into the planted directory."""
    planted = "/tmp/dscluster-nvme-$(id -u ds)"
    plant = f'rm -rf {planted} && su -s /bin/sh nobody -c "mkdir -m 0777 {planted}"'
    made = on(N2, f"{plant} && echo {planted}")
    assert made.returncode == 0, made.stderr
    path = made.stdout.strip()
    # The job's files as `dscluster smoke` stages them: the entry script and its modules.
    jobs = pathlib.Path(__file__).resolve().parents[2] / "src/dscluster/jobs"
    job = tmp_path / "smoke-job"
    job.mkdir()
    for name in SMOKE_JOB_FILES:
        shutil.copyfile(jobs / name, job / name)
    try:
        proc = dsc(
            "launch", "-i", str(provisioned), "--launcher", "deepspeed", "--no-doctor",
            "--master-port", "29523", "--timeout", "180", "--workdir", str(job), "--",
            "smoke_job.py",
            "--zero", "3", "--offload", "nvme", "--steps", "2", "--report", "r.json", timeout=400,
        )  # fmt: skip
        assert proc.returncode != 0
        line = error_line(proc)
        assert f"first error on {N2}: --nvme-dir {path} is not a directory of this user's" in line
        assert on(N2, f"stat -c '%U %a' {path} && ls -A {path}").stdout.split() == ["nobody", "777"]
    finally:
        on(N2, f"rm -rf {path}")
