#!/usr/bin/env python3
"""dscluster doctor's probe: runs on the nodes (system python3, stdlib only) and prints JSON.

Subcommands, each bounded in time and never failing on what it finds (findings are data;
the controller judges them):
  node     this node's own checks: name resolution of every cluster host, /dev/shm, free
           disk, the versions manifest (live, through the cluster venv), libaio and the
           async_io op, socket interface names, accelerators detected now, the shared token;
           and the vendor tools' raw health outputs (HEALTH below), judged on the controller
  start    the first call, run by ansible.builtin.script: make a private directory (0755, so
           the training user can run the probe), copy this file there, start the
           listener from it in the background and print the ports it bound and the directory
           (removing the directory stops the listener within a second)
  listen   bind the rendezvous port / sampled ephemeral ports, answer each connection with
           this node's name, for a bounded time (started in the background by `start`)
  connect  TCP connect to every other node's listeners, in parallel, bounded per attempt
  ssh      ssh BatchMode=yes StrictHostKeyChecking=yes to every host as --user, with the
           remote clock read over the same session (offset)
  pdsh     on the head: pdsh -R ssh to all hosts as --user (DeepSpeed's path), reading each
           node's `ulimit -l` as the launcher's sessions see it

ssh and pdsh are run by root (`python3 -I`, this file root's in a root-owned directory): only
the ssh or pdsh itself drops to the training user, through `runuser -u USER --` (the user's
PAM session and limits, HOME, USER), so nothing of the user's (a usercustomize in ~/.local, a
ptrace of one of its processes) runs in this process or touches what it prints. Each verdict
is root's, from the exit status root saw.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import glob
import grp
import json
import os
import pathlib
import pwd
import random
import re
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

BANNER = b"dscluster-doctor "


def run(
    argv: list[str], timeout: float, env: dict | None = None, cwd: str | None = None
) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd=cwd
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv[:3])}...: no answer within {timeout:.0f} s"
    return proc.returncode, proc.stdout, proc.stderr


# ---- what root runs: root's up to / ------------------------------------------------------

# The probe's copy of plugins/module_utils/safe_fs.py's root_chain (the probe runs alone, with
# the system python3 and nothing of the collection's; a unit test holds the two to the same
# verdicts). Root runs the venv's python, the recorder, the interface checker and the
# accelerators fact script from paths that come from variables: each is checked first, and
# where it is not root's all the way to / nothing from it runs; the finding names the path.
LINK_HOPS = 16


def _name(table, key: int) -> str:
    try:
        return table(key)[0]
    except KeyError:
        return str(key)


def _refusal(path: str, here: str, st: os.stat_result, via: list[str]) -> str:
    try:
        primary = pwd.getpwuid(st.st_uid).pw_gid
    except KeyError:
        primary = -1
    group_others = st.st_mode & 0o020 and st.st_gid not in (0, primary)
    others = st.st_mode & 0o002 or group_others
    if st.st_uid != 0:
        problem = f"{here} belongs to {_name(pwd.getpwuid, st.st_uid)}"
    elif others and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        problem = (
            f"{here} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, group "
            f"{_name(grp.getgrgid, st.st_gid)})"
        )
    else:
        return ""
    route = f" (through {', '.join(via)})" if via else ""
    return (
        f"{path}{route}: {problem}; root runs nothing from a path another user could change, "
        f"so nothing from it was run: make {here} root's (chown root:root, chmod go-w) or set "
        "the variable that names this path to one below root's own directories (/opt/dscluster)"
    )


def root_chain(path: str) -> str:
    """'' where root alone can change `path` and every directory above it up to /, else the
    one-line finding (see safe_fs.root_chain: links followed and their targets checked, a
    sticky directory accepted, a missing tail not checked)."""
    todo = [p for p in path.split("/") if p]
    if not path.startswith("/") or any(name in (".", "..") for name in todo):
        return f"{path} is not an absolute path given plainly (no '.' or '..')"
    todo.reverse()
    here, st = "/", os.lstat("/")
    via: list[str] = []  # the links followed, for the message
    while True:
        if problem := _refusal(path, here, st, via):
            return problem
        if not todo:
            return ""
        if not stat.S_ISDIR(st.st_mode):
            return f"{path}: {here} is not a directory"
        name = todo.pop()
        if name in ("", "."):
            continue
        nxt = os.path.dirname(here) if name == ".." else os.path.join(here, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return ""
        if not stat.S_ISLNK(st.st_mode):
            here = nxt
            continue
        if len(via) >= LINK_HOPS:
            return f"{path}: more than {LINK_HOPS} links on the way, at {nxt}"
        target = os.readlink(nxt)
        via.append(f"{nxt} -> {target}")
        if target.startswith("/"):
            here = "/"
        st = os.lstat(here)
        todo.extend(reversed(target.split("/")))


def unsafe(*paths: str) -> str:
    """The first of `paths` root may not run from (its finding), or ''."""
    return next((problem for path in paths if (problem := root_chain(path))), "")


# ---- health: the vendor tools' own outputs, recorded raw -----------------------------------

# The probe's copy of dscluster.doctor.health.FILES (the probe cannot import dscluster):
# file name -> (argv, seconds it may take). Absent tools cost a PATH lookup, nothing more.
HEALTH: dict[str, tuple[list[str], float]] = {
    "nvidia-smi-q.xml": (["nvidia-smi", "-q", "-x"], 30),
    "nvidia-smi-topo.txt": (["nvidia-smi", "topo", "-m"], 15),
    "nvidia-smi-nvlink-s.txt": (["nvidia-smi", "nvlink", "-s"], 15),
    "nvidia-smi-nvlink-e.txt": (["nvidia-smi", "nvlink", "-e"], 15),
    "lspci-vvv.txt": (["lspci", "-vvv"], 15),
    "kernel.log": (["dmesg"], 10),
    "fi_info-efa.txt": (["fi_info", "-p", "efa"], 10),
    "ibv_devinfo.txt": (["ibv_devinfo"], 10),
    "dcgmi-diag.json": (["dcgmi", "diag", "-r", "1", "-j"], 0),  # level and time: the budget
    "hl-smi-q.txt": (["hl-smi", "-q"], 30),
}
HEALTH_CAP = 4 << 20  # bytes kept of one output; the rest is cut and the cut noted
# Output that is still the tool's report when it exits non-zero (a failed dcgm test, a GPU
# nvidia-smi cannot query among others): kept, with its rc in the index.
REPORT_STARTS = {".xml": "<", ".json": "{"}
# Kernel log lines the judges read (Xid, PCIe AER, the GPU/HPU/NIC drivers, machine checks):
# only these leave the node, below a first line saying how many of how many were kept; that
# bounds the size and keeps the rest of the log (users' processes, mounts, USB...) private.
KERNEL_LINES = re.compile(
    r"NVRM|Xid|nvidia|nvswitch|nvlink|habanalabs|\befa\b|mlx5|infiniband|\bib_|AER|"
    r"PCIe Bus Error|pcieport|fallen off the bus|Hardware Error|\bmce\b|EDAC",
    re.IGNORECASE,
)
# dcgmi diag levels by the time they take (DCGM docs, dcgmi diag --run: 1 "seconds",
# 2 "approximately two minutes", 3 "approximately 15 minutes" (30 in older releases),
# 4 "extended", 1-2 hours; https://docs.nvidia.com/datacenter/dcgm/latest/reference/
# command-line-reference/dcgmi/dcgmi-diag.html): the highest level the budget covers.
DCGM_LEVELS = ((4, 7200), (3, 1800), (2, 120), (1, 0))


def dcgm_level(budget: float) -> int:
    """The dcgmi diag level a budget in seconds pays for; 0 (not run) for no budget."""
    if budget <= 0:
        return 0
    return next(level for level, needs in DCGM_LEVELS if budget >= needs)


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def reason(tool: str, err: str, out: str, rc: int | None) -> str:
    """ "tool: its first line of complaint", without the tool's name twice."""
    why = one_line(err) or one_line(out) or f"exit {rc}"
    if why == "-- No entries --":
        why = "no entries"
    return why if why.startswith(f"{tool}: ") else f"{tool}: {why}"


def capture(argv: list[str], timeout: float) -> tuple[int | None, str, str, float]:
    """rc (None: not found or timed out), stdout, stderr (decoded, bad bytes replaced), seconds.
    The tool runs in a session of its own: on a timeout its whole group is killed, so no
    helper it started keeps our pipes open."""
    start = time.monotonic()
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        why = "not found" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        return None, "", why, time.monotonic() - start
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "", f"no answer within {timeout:.0f} s", time.monotonic() - start
    seconds = time.monotonic() - start
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), seconds


def kernel_log() -> tuple[dict, str | None]:
    """The kernel log since boot, only the lines the judges read: dmesg, or the journal's
    kernel messages where dmesg is restricted (kernel.dmesg_restrict without CAP_SYSLOG)."""
    tried = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"]):
        if shutil.which(argv[0]) is None:
            tried.append(f"{argv[0]}: not found")
            continue
        rc, out, err, seconds = capture(argv, HEALTH["kernel.log"][1])
        lines = out.splitlines()
        if rc == 0 and lines and not (argv[0] == "journalctl" and lines == ["-- No entries --"]):
            kept = [ln for ln in lines if KERNEL_LINES.search(ln)]
            entry = {"argv": argv, "rc": rc, "seconds": round(seconds, 3)}
            entry.update(lines=len(lines), kept=len(kept), filter=KERNEL_LINES.pattern)
            # a first line that says so: a log with nothing to report is not an empty file
            # (which a judge reads as "the kernel log could not be read")
            head = f"# dscluster doctor: {len(kept)} of {len(lines)} lines of '{' '.join(argv)}'"
            head += " kept, those the health judges read\n"
            return entry, head + "".join(ln + "\n" for ln in kept)
        tried.append(
            reason(argv[0], err, out, rc) if rc or out.strip() else f"{argv[0]}: no entries"
        )
    return {"argv": ["dmesg"], "rc": None, "seconds": 0.0, "missing": "; ".join(tried)}, None


def record_one(name: str, argv: list[str], timeout: float) -> tuple[dict, str | None]:
    entry: dict = {"argv": argv, "rc": None, "seconds": 0.0}
    if shutil.which(argv[0]) is None:
        entry["missing"] = f"{argv[0]}: not found"
        return entry, None
    rc, out, err, seconds = capture(argv, timeout)
    entry.update(rc=rc, seconds=round(seconds, 3))
    start = REPORT_STARTS.get(os.path.splitext(name)[1])
    if rc == 0 or (rc is not None and start and out.lstrip().startswith(start)):
        return entry, out
    # nvidia-smi without a driver (rc 9), fi_info without an EFA device: the tool's own reason
    entry["missing"] = reason(argv[0], err, out, rc)
    return entry, None


def not_run(argv: list[str], why: str) -> tuple[dict, str | None]:
    return {"argv": argv, "rc": None, "seconds": 0.0, "missing": why}, None


def capped(entry: dict, text: str, keep_tail: bool) -> str:
    data = text.encode()
    if len(data) <= HEALTH_CAP:
        return text
    entry["truncated"] = {
        "bytes": len(data),
        "kept": HEALTH_CAP,
        "end": "last" if keep_tail else "first",
    }
    cut = data[-HEALTH_CAP:] if keep_tail else data[:HEALTH_CAP]
    return cut.decode(errors="ignore")


def health(gpu_diag_budget: float) -> dict:
    """Every HEALTH file, in parallel: {"files": {name: text}, "index": {name: {"argv", "rc",
    "seconds", "missing"?, "truncated"?}}}. Never fails: a tool that is absent or has no device
    gives its reason as "missing"."""
    jobs = {}
    level = dcgm_level(gpu_diag_budget)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(HEALTH)) as pool:
        for name, (argv, timeout) in HEALTH.items():
            if name == "kernel.log":
                jobs[name] = pool.submit(kernel_log)
            elif name == "dcgmi-diag.json" and level == 0:
                why = "dcgmi diag not run (doctor --gpu-diag-budget is 0)"
                if shutil.which("dcgmi") is None:
                    why = "dcgmi: not found"
                jobs[name] = pool.submit(not_run, argv, why)
            elif name == "dcgmi-diag.json":
                diag = ["dcgmi", "diag", "-r", str(level), "-j"]
                jobs[name] = pool.submit(record_one, name, diag, gpu_diag_budget)
            else:
                jobs[name] = pool.submit(record_one, name, argv, timeout)
    files, index = {}, {}
    for name, job in jobs.items():
        entry, text = job.result()
        if text is not None:
            files[name] = capped(entry, text, keep_tail=name == "kernel.log")
        index[name] = entry
    return {"files": files, "index": index}


# ---- node ----------------------------------------------------------------------------------


def resolve(hosts: dict[str, str]) -> dict[str, dict]:
    """Each host name as this node resolves it (getent ahostsv4: /etc/hosts, DNS, nss)."""
    result = {}
    for name, expected in hosts.items():
        rc, out, _ = run(["getent", "ahostsv4", name], timeout=10)
        # in getaddrinfo's order: clients (ssh, gloo) try the first address first
        addresses = list(dict.fromkeys(ln.split()[0] for ln in out.splitlines() if ln.strip()))
        result[name] = {"expected": expected, "addresses": addresses, "rc": rc}
    return result


def free_space(paths: list[str]) -> dict[str, dict]:
    out = {}
    for path in paths:
        probe = pathlib.Path(path)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent  # a venv not made yet: the filesystem it would go on
        st = os.statvfs(probe)
        out[path] = {"free_bytes": st.f_bavail * st.f_frsize, "measured_at": str(probe)}
    return out


def shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
    except OSError as exc:
        return {"size_bytes": 0, "error": str(exc)}
    return {"size_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def versions(venv: str, recorder: str, wheelhouse: str) -> dict:
    python = f"{venv}/bin/python"
    if problem := unsafe(venv, f"{venv}/bin", python, recorder):
        return {"error": problem, "unsafe": True}
    if not os.path.exists(python):
        return {"error": f"{python} does not exist (no cluster venv)"}
    if not os.path.exists(recorder):
        return {"error": f"{recorder} does not exist (ml_stack not provisioned)"}
    rc, out, err = run([python, recorder, wheelhouse], timeout=120)
    if rc != 0:
        tail = " ".join(err.strip().splitlines()[-2:])[-300:]
        return {"error": f"importing torch/deepspeed failed (exit {rc}): {tail}"}
    try:
        manifest = json.loads(out)
    except ValueError:
        return {"error": f"the versions recorder printed no JSON: {out[:200]}"}
    manifest.pop("wheels", None)  # lock_sha256 names the wheel set
    return manifest


def libaio(venv: str) -> dict:
    """libaio in the loader cache, and whether the pre-built async_io op still loads its libs
    (ldd, which may run what it reads: not on a venv that is not root's up to /)."""
    _, out, _ = run(["ldconfig", "-p"], timeout=20)
    present = any("libaio.so.1" in line for line in out.splitlines())
    if problem := unsafe(venv):
        return {"ldconfig": present, "async_io_op": "", "missing_libs": [], "error": problem}
    ops = sorted(glob.glob(f"{venv}/lib/python3*/site-packages/deepspeed/ops/aio/async_io_op*.so"))
    ops += sorted(glob.glob(f"{venv}/lib/python3*/site-packages/deepspeed/ops/async_io_op*.so"))
    missing: list[str] = []
    # torch's own libraries are found through its lib directory when the op is imported
    torch_lib = ":".join(glob.glob(f"{venv}/lib/python3*/site-packages/torch/lib"))
    env = dict(os.environ, LD_LIBRARY_PATH=torch_lib)
    for op in ops[:1]:
        _, ldd, _ = run(["ldd", op], timeout=20, env=env)
        missing = [ln.split()[0] for ln in ldd.splitlines() if "not found" in ln]
    return {"ldconfig": present, "async_io_op": ops[0] if ops else "", "missing_libs": missing}


def ifnames(specs: dict[str, str], nccl_conf: str, profile_script: str, fact: dict) -> dict:
    """Every socket interface setting this node's ranks will see, checked with NCCL's syntax
    (the nccl_env role's own checker) against the interfaces that have an IPv4 address."""
    settings = dict(specs)
    with contextlib.suppress(OSError):
        for line in pathlib.Path(nccl_conf).read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "NCCL_SOCKET_IFNAME" and value.strip():
                settings.setdefault("NCCL_SOCKET_IFNAME", value.strip())
    result: dict[str, dict] = {}
    problem = unsafe(profile_script)
    for variable, spec in sorted(settings.items()):
        if problem:
            result[variable] = {"spec": spec, "error": problem, "unsafe": True}
            continue
        if not os.path.exists(profile_script):
            result[variable] = {"spec": spec, "error": f"{profile_script} missing"}
            continue
        proc = subprocess.run(
            [sys.executable, profile_script, "check-ifname", spec, "--fact", "-"],
            input=json.dumps(fact),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        entry = {"spec": spec, "matched": proc.stdout.split()}
        if proc.returncode != 0:
            entry["error"] = proc.stderr.strip().replace("NCCL_SOCKET_IFNAME", variable)
        result[variable] = entry
    return result


def accelerators(fact_script: str) -> dict:
    if problem := unsafe(fact_script):
        return {"error": problem, "unsafe": True}
    if not os.path.exists(fact_script):
        return {"error": f"{fact_script} missing (node_facts not provisioned)"}
    rc, out, err = run([fact_script], timeout=60)
    try:
        return json.loads(out) if rc == 0 else {"error": err.strip()[-300:]}
    except ValueError:
        return {"error": f"{fact_script} printed no JSON"}


def cmd_node(args: argparse.Namespace) -> dict:
    hosts = json.loads(args.hosts)
    # the health outputs are gathered while the other checks run (nvidia-smi takes seconds)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    recorded = pool.submit(health, args.gpu_diag_budget)
    pool.shutdown(wait=False)  # the job runs on; .result() below waits for it
    fact = accelerators(args.accelerators_fact)
    shared = {}
    if args.shared_token:
        token = pathlib.Path(args.shared_token)
        try:
            shared = {"path": str(token), "read": token.read_text().strip()}
        except OSError as exc:
            shared = {"path": str(token), "read": "", "error": exc.strerror or str(exc)}
    return {
        "hostname": socket.gethostname(),
        "resolve": resolve(hosts),
        "shm": shm(),
        "disk": free_space([p for p in args.paths.split(",") if p]),
        "versions": versions(args.venv, args.recorder, args.wheelhouse),
        "libaio": libaio(args.venv),
        "ifname": ifnames(json.loads(args.ifnames), args.nccl_conf, args.profile_script, fact),
        "accelerators": {k: fact.get(k) for k in ("kind", "count", "error", "unsafe") if k in fact},
        "nics": fact.get("nics", []),
        "shared": shared,
        "health": recorded.result(),
        "time": time.time(),
    }


# ---- listen / connect ----------------------------------------------------------------------


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def bind(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return None
    sock.listen(64)
    sock.setblocking(False)
    return sock


def cmd_listen(args: argparse.Namespace) -> dict:
    """Bind, write the state file (ports bound, ports busy), serve until --seconds pass."""
    low, high = ephemeral_range()
    socks: dict[int, socket.socket] = {}
    busy: list[int] = []
    if args.rendezvous:
        sock = bind(args.rendezvous)
        if sock is None:
            busy.append(args.rendezvous)
        else:
            socks[args.rendezvous] = sock
    # Ports spread over the whole ephemeral range: the low end, the middle, the high end
    # (a firewall rule that lets part of the range through is found) and random ones.
    span = high - low
    wanted = [low + span * i // max(1, args.ephemeral - 1) for i in range(args.ephemeral)]
    rng = random.Random()
    for port in wanted:
        for candidate in [port, *rng.sample(range(low, high + 1), 20)]:
            if candidate not in socks and (sock := bind(candidate)) is not None:
                socks[candidate] = sock
                break
    state = {
        "pid": os.getpid(),
        "rendezvous": args.rendezvous if args.rendezvous in socks else None,
        "busy": busy,
        "ephemeral": sorted(p for p in socks if p != args.rendezvous),
        "range": [low, high],
    }
    tmp = f"{args.state}.tmp"
    pathlib.Path(tmp).write_text(json.dumps(state))
    os.replace(tmp, args.state)
    banner = BANNER + socket.gethostname().encode() + b"\n"
    selector = selectors.DefaultSelector()
    for sock in socks.values():
        selector.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + args.seconds
    while (left := deadline - time.monotonic()) > 0 and os.path.exists(args.state):
        for key, _ in selector.select(timeout=min(1.0, left)):
            with contextlib.suppress(OSError):
                conn, _ = key.fileobj.accept()
                with conn:
                    conn.settimeout(2)
                    conn.sendall(banner)
    return state


def cmd_start(args: argparse.Namespace) -> dict:
    """Directory, probe file, listener in the background; the listener's state once written."""
    directory = tempfile.mkdtemp(prefix="dscluster-doctor-")
    os.chmod(directory, 0o755)
    probe = os.path.join(directory, "doctor_probe.py")
    shutil.copyfile(__file__, probe)
    os.chmod(probe, 0o644)
    state = os.path.join(directory, "listen.json")
    argv = [sys.executable, probe, "listen", "--state", state]
    argv += ["--rendezvous", str(args.rendezvous), "--ephemeral", str(args.ephemeral)]
    argv += ["--seconds", str(args.seconds)]
    # its own session, no pipe of ours: the command that started it returns at once
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    deadline = time.monotonic() + args.wait
    while not os.path.exists(state):
        if child.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                child.kill()
            shutil.rmtree(directory, ignore_errors=True)
            if child.returncode is None:
                sys.exit(f"doctor's listener wrote no state within {args.wait:.0f} s")
            sys.exit(f"doctor's listener exited {child.returncode} before it bound its ports")
        time.sleep(0.05)
    return {"dir": directory, **json.loads(pathlib.Path(state).read_text())}


def connect_one(address: str, port: int, timeout: float) -> dict:
    start = time.monotonic()
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = b""
            while not data.endswith(b"\n") and len(data) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return {"ok": False, "error": reason, "seconds": round(time.monotonic() - start, 3)}
    if not data.startswith(BANNER):
        return {"ok": False, "error": f"something else answers: {data[:40]!r}"}
    return {"ok": True, "answered": data[len(BANNER) :].decode(errors="replace").strip()}


def cmd_connect(args: argparse.Namespace) -> dict:
    addresses = json.loads(args.addresses)  # {host: address}
    jobs = []
    for host, listen in sorted(json.loads(args.listens).items()):  # {host: its listen state}
        jobs += [(host, addresses[host], port, "ephemeral") for port in listen["ephemeral"]]
        if listen.get("rendezvous"):
            jobs.append((host, addresses[host], listen["rendezvous"], "rendezvous"))
    results: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(64, max(1, len(jobs)))) as pool:
        futures = {
            pool.submit(connect_one, a, port, args.timeout): (h, port, k) for h, a, port, k in jobs
        }
        for future in concurrent.futures.as_completed(futures):
            host, port, kind = futures[future]
            results.append({"host": host, "port": port, "kind": kind, **future.result()})
    return {"results": sorted(results, key=lambda r: (r["host"], r["port"]))}


# ---- ssh / pdsh (run by root, each as the training user) -----------------------------------

SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]


def as_user(user: str, argv: list[str]) -> list[str]:
    """argv run as `user` by runuser (util-linux): root's process starts it and waits for it;
    runuser's exit status is the command's (1, 126 or 127 where runuser itself fails)."""
    return ["runuser", "-u", user, "--", *argv]


def ssh_one(host: str, timeout: int, user: str) -> dict:
    """Log in as a launcher would; the remote clock is read over the same session: the offset
    is remote - local at the moment the line arrives (LAN latency, not the handshake)."""
    ssh = ["ssh", *SSH_OPTIONS, "-o", f"ConnectTimeout={timeout}", host, "date +%s.%N"]
    argv = as_user(user, ssh)
    start = time.time()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd="/",
            start_new_session=True,  # runuser and the user's ssh: one group to kill
        )
    except FileNotFoundError:
        return {"ok": False, "error": "runuser: not installed"}
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        arrived = time.time()
        _, err = proc.communicate(timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # killing runuser alone leaves ssh running
        proc.communicate()
        return {"ok": False, "error": f"no answer within {timeout + 5} s"}
    if proc.returncode != 0:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        return {"ok": False, "error": (lines[-1] if lines else f"ssh exited {proc.returncode}")}
    try:
        remote = float(line.strip())
    except ValueError:
        return {"ok": False, "error": f"remote shell printed {line.strip()[:60]!r}, not the time"}
    return {"ok": True, "offset_s": round(remote - arrived, 4), "rtt_s": round(arrived - start, 3)}


# Logins in flight from one node at once, each node starting with the host after itself (as
# cluster_ssh's login round): an sshd then has about this many connections being authenticated
# at once, twice that where nodes are a few logins apart, under sshd's MaxStartups (10; past
# it sshd drops new connections unauthenticated). All at once and in the same order, every
# node's first login went to the first host: on more than 10 nodes, false "ssh" failures.
SSH_PARALLEL = 4


def login_order(hosts: list[str], me: str) -> list[str]:
    """The hosts after `me` in the play's order, wrapping round to `me` last (as given when
    `me` is not one of them)."""
    if me not in hosts:
        return list(hosts)
    i = hosts.index(me)
    return hosts[i + 1 :] + hosts[: i + 1]


def cmd_ssh(args: argparse.Namespace) -> dict:
    hosts = [h for h in args.hosts.split(",") if h]
    order = login_order(hosts, args.me)
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(SSH_PARALLEL, len(hosts)))
    ) as pool:
        logins = pool.map(lambda h: ssh_one(h, args.timeout, args.user), order)
        done = dict(zip(order, logins, strict=True))
    results = {h: done[h] for h in hosts}  # in the play's order, whatever order they ran in
    return {"user": args.user, "results": results}


def cmd_pdsh(args: argparse.Namespace) -> dict:
    hosts = [h for h in args.hosts.split(",") if h]
    if shutil.which("pdsh") is None:
        return {"installed": False, "error": "pdsh is not installed on the head"}
    env = dict(os.environ, PDSH_RCMD_TYPE="ssh")
    argv = ["pdsh", "-S", "-R", "ssh", "-f", "1024", "-t", str(args.timeout), "-u"]
    argv += [str(args.timeout * 2), "-w", ",".join(hosts), "echo memlock=$(ulimit -l)"]
    # runuser keeps the environment (PDSH_RCMD_TYPE) and sets HOME and USER to the user's
    rc, out, err = run(as_user(args.user, argv), timeout=args.timeout * 3 + 10, env=env, cwd="/")
    memlock: dict[str, str] = {}
    for line in out.splitlines():
        if m := re.match(r"^(\S+): memlock=(\S+)$", line.strip()):
            memlock[m[1]] = m[2]
    errors: dict[str, str] = {}
    for line in err.splitlines():
        m = re.match(r"^(?:pdsh@\S+: )?([^:\s]+): (.+)$", line.strip())
        if m and m[1] in hosts:
            errors.setdefault(m[1], m[2])
    return {"installed": True, "rc": rc, "memlock": memlock, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node")
    node.add_argument("--hosts", required=True, help="JSON {host: address}")
    node.add_argument("--venv", required=True)
    node.add_argument("--recorder", required=True)
    node.add_argument("--wheelhouse", required=True)
    node.add_argument("--paths", default="")
    node.add_argument("--ifnames", default="{}", help="JSON {variable: spec}")
    node.add_argument("--nccl-conf", default="/etc/nccl.conf")
    node.add_argument("--profile-script", required=True)
    node.add_argument("--accelerators-fact", required=True)
    node.add_argument("--shared-token", default="")
    node.add_argument(
        "--gpu-diag-budget", type=float, default=0, help="seconds for dcgmi diag (0: not run)"
    )
    # What a listener binds and for how long: `start` passes it on to the `listen` it starts.
    ports = argparse.ArgumentParser(add_help=False)
    ports.add_argument("--rendezvous", type=int, default=0)
    ports.add_argument("--ephemeral", type=int, default=3)
    ports.add_argument("--seconds", type=float, default=120)
    start = sub.add_parser("start", parents=[ports])
    start.add_argument("--wait", type=float, default=30, help="seconds for the listener to bind")
    listen = sub.add_parser("listen", parents=[ports])
    listen.add_argument("--state", required=True)
    conn = sub.add_parser("connect")
    conn.add_argument("--addresses", required=True, help="JSON {host: address}")
    conn.add_argument("--listens", required=True, help="JSON {host: listen state}")
    conn.add_argument("--timeout", type=float, default=3)
    ssh = sub.add_parser("ssh")
    ssh.add_argument("--hosts", required=True)
    ssh.add_argument("--timeout", type=int, default=5)
    ssh.add_argument(
        "--me", default="", help="this node's name in --hosts: it logs in after the rest"
    )
    pdsh = sub.add_parser("pdsh")
    pdsh.add_argument("--hosts", required=True)
    pdsh.add_argument("--timeout", type=int, default=10)
    for login in (ssh, pdsh):
        login.add_argument("--user", required=True, help="log in as this user (runuser -u)")
    args = parser.parse_args(argv)
    handler = {
        "node": cmd_node,
        "start": cmd_start,
        "listen": cmd_listen,
        "connect": cmd_connect,
        "ssh": cmd_ssh,
        "pdsh": cmd_pdsh,
    }[args.command]
    json.dump(handler(args), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
