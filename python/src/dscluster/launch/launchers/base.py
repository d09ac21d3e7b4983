"""What every launcher module shares: the Job it renders from, what it hands back, the shell
words of the head's scripts and the pinning of ranks to slots; pure."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from typing import NamedTuple

from ...errors import DsclusterError
from ..request import JobSite, LaunchRequest

# Every ssh the launchers start (pdsh, mpirun) notices a node that stopped answering in
# about 15 s instead of TCP's hours, and gives up connecting after 10 s.
SSH_LIVENESS_ARGS = "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o ConnectTimeout=10"
# Environment naming the devices a process may use, per accelerator kind (DeepSpeed's
# accelerators' visible_devices_envs()); CPU slots are not devices.
VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "hpu": "HABANA_VISIBLE_MODULES"}

# The files staged with the job: name -> (text, mode).
Files = dict[str, tuple[str, str]]


class Raw(str):
    """A word the head's shell expands (our own, never a user's): left unquoted."""


# The head's clock when launch.sh starts the launcher (the smoke job's `--launch-time`).
LAUNCH_TIME = Raw('"$DSCLUSTER_LAUNCH_TIME"')


def shell_join(words: Sequence[str]) -> str:
    return " ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in words)


@dataclasses.dataclass(frozen=True)
class Job:
    """The request resolved on its site: the selected slots (host -> slot indices, hostfile
    order), the master (the first selected host, as DeepSpeed) and the .deepspeed_env keys."""

    request: LaunchRequest
    site: JobSite
    resources: dict[str, list[int]]
    master: str
    env: dict[str, str]

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.resources.values())

    def devices(self, host: str) -> dict[str, str]:
        """visible_devices for `host`'s selected slots."""
        slots = self.resources[host]
        return visible_devices(self.site.accelerators.get(host, "cpu"), slots, self.site.pool[host])


class HeadCommand(NamedTuple):
    """What a launcher hands build_plan: the head's command, and the shell lines launch.sh
    runs before it (checks that refuse to start what cannot work, the launcher's setup),
    and the options launch_watch.py gets besides (torchrun's elastic mode: --elastic MIN)."""

    argv: list[str]
    prelude: Sequence[str] = ()
    watch: Sequence[str] = ()


def visible_devices(accelerator: str, slots: Sequence[int], total: int) -> dict[str, str]:
    """The env that pins a node's ranks to its selected slots (none when it has them all)."""
    var = VISIBLE_DEVICES_ENV.get(accelerator)
    if var is None or list(slots) == list(range(total)):
        return {}
    return {var: ",".join(str(s) for s in slots)}


def whole_slots_only(job: Job, *, prefix: bool = False) -> None:
    """Refuse slot selections a hostfile cannot express (`prefix`: the first N slots can be,
    the launcher pins them itself as DeepSpeed does)."""
    for host, slots in job.resources.items():
        if prefix and slots == list(range(len(slots))):
            continue
        if job.devices(host):
            raise DsclusterError(
                f"--launcher {job.request.launcher} cannot pin ranks to slots {slots} on "
                f"{host}; select whole hosts or the first N slots (--num-gpus), or use "
                "torchrun/deepspeed"
            )
