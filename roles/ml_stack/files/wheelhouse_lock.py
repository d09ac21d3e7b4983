#!/usr/bin/env python3
"""One wheelhouse build at a time on the controller.

Two provisioning runs on one controller (two clusters, or `make test` running its scenarios
side by side) share the wheelhouse cache. Without a lock both would download torch and
compile DeepSpeed's ops into the same directory at once. The lock is a directory made with
mkdir (atomic); it records the ansible-playbook process that holds it, with that process's
start time, so a lock left by a run that was killed is taken over instead of waited on.

  wheelhouse_lock.py acquire LOCKDIR [--timeout S]   # exit 0 once held, 1 on timeout
  wheelhouse_lock.py release LOCKDIR                 # only the holder's own lock is removed
Runs on the controller (stdlib only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22 of stat: starttime


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def owner_pid() -> int:
    """The outermost ansible-playbook process above this one (its workers are forks of it),
    else our parent: the process whose life the lock should follow."""
    pid, found = os.getppid(), None
    while pid > 1:
        if "ansible-playbook" in _cmdline(pid) or "ansible_runner" in _cmdline(pid):
            found = pid
        fields = _stat(pid)
        if not fields:
            break
        pid = int(fields[1])
    return found or os.getppid()


def _owner(lock: str) -> dict | None:
    try:
        with open(os.path.join(lock, "owner.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _alive(owner: dict | None) -> bool:
    if not owner:
        return True  # being written right now by the process that made the directory
    return start_time(int(owner["pid"])) == owner.get("start")


def acquire(lock: str, timeout: float, poll: float = 2.0) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(lock)), exist_ok=True)
    me = owner_pid()
    record = {"pid": me, "start": start_time(me), "host": os.uname().nodename}
    deadline = time.monotonic() + timeout
    waited_for = None
    while True:
        try:
            os.mkdir(lock)
        except FileExistsError:
            owner = _owner(lock)
            if owner and owner.get("pid") == me and owner.get("start") == record["start"]:
                return 0  # ours already (a task retried)
            if owner and not _alive(owner):
                print(f"taking over the lock of process {owner['pid']}, which has ended")
                shutil.rmtree(lock, ignore_errors=True)
                continue
            if time.monotonic() > deadline:
                print(
                    f"the wheelhouse lock {lock} is still held by process "
                    f"{(owner or {}).get('pid', '?')} after {timeout:.0f} s; if no other "
                    "provisioning run is building the wheelhouse, remove that directory",
                    file=sys.stderr,
                )
                return 1
            waited_for = (owner or {}).get("pid", "?")
            time.sleep(poll)
            continue
        tmp = os.path.join(lock, ".owner.json")
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(lock, "owner.json"))
        if waited_for is not None:
            print(f"held (waited for process {waited_for})")
        return 0


def release(lock: str) -> int:
    owner = _owner(lock)
    me = owner_pid()
    if owner and owner.get("pid") == me and owner.get("start") == start_time(me):
        shutil.rmtree(lock, ignore_errors=True)
        print("released")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("acquire", "release"))
    parser.add_argument("lock")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    if args.action == "acquire":
        return acquire(args.lock, args.timeout)
    return release(args.lock)


if __name__ == "__main__":
    sys.exit(main())
