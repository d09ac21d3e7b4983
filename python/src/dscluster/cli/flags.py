"""Options that several commands share, defined once (as skypilot's sky/client/cli/flags.py).

One spelling per concept across commands; the spellings older releases used stay as hidden
aliases that still parse into the same place:

    -i/--inventory     the inventory (inventories/<name> or its hosts.yml)
    --launcher         how ranks start (`sbatch --mode` is an alias)
    --master-port      rendezvous port on the head (`--port`); default: the inventory's
                       dscluster_master_port, else inventory.DEFAULT_MASTER_PORT
    --slots            slots per node (`--cpu-slots`, `--slots-per-node`)
    --zero             ZeRO stage(s): `2` or `1,2,3`
    --offload          none | cpu | nvme
    -o/--out           the file or directory dscluster writes (`--script` for sbatch)
    --slurm-output     Slurm's own log file, #SBATCH --output (`--output`)
    --accelerate-config / --accelerate-config-kind   launch and sbatch --launcher accelerate
    --no-doctor / --exclude-unhealthy   smoke and launch: skip doctor, or act on its report
    --nnodes MIN:MAX   launch --launcher torchrun: torchrun's elastic mode
    --max-restarts / --min-nodes / --checkpoint-dir   launch and sbatch: restarts after a lost node
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import validate
from ..dsconfig import OFFLOADS, ZERO_STAGES
from ..errors import DsclusterError
from ..inventory import DEFAULT_MASTER_PORT, Inventory

if TYPE_CHECKING:
    from rich.console import Console

    from ..doctor import Excluded

PORT = validate.port_type_for("--master-port")
SLOTS = validate.count_type(1, validate.MAX_SLOTS, "slots per node", 2, flag="--slots")


def alias(parser: argparse.ArgumentParser, *old: str, dest: str, **kwargs) -> None:
    """Old spellings of an option: parsed into `dest`, hidden from --help."""
    parser.add_argument(
        *old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs
    )


def inventory(parser: argparse.ArgumentParser, *, required: bool = True, help: str = "") -> None:
    parser.add_argument(
        "-i",
        "--inventory",
        required=required,
        help=help or "inventories/<name> or its hosts.yml",
    )


def launcher(
    parser: argparse.ArgumentParser,
    choices: Sequence[str],
    *,
    default: str | None = None,
    help: str,
    old: Sequence[str] = (),
) -> None:
    """--launcher with its choices; `old` names aliases (sbatch's --mode). Without a default
    one spelling is required; argparse cannot require one of two, so main() checks it."""
    parser.add_argument("--launcher", choices=choices, default=default, help=help)
    if old:
        alias(parser, *old, dest="launcher", choices=choices)
    if default is None:
        require(parser, "launcher")


def accelerate_config(parser: argparse.ArgumentParser) -> None:
    """--accelerate-config FILE / --accelerate-config-kind, for --launcher accelerate."""
    from ..launch.accelerate import CONFIG_KINDS  # noqa: PLC0415

    parser.add_argument(
        "--accelerate-config",
        metavar="FILE",
        type=validate.existing_file_type("--accelerate-config"),
        help="--launcher accelerate: your accelerate config (YAML or JSON), staged with the job",
    )
    parser.add_argument(
        "--accelerate-config-kind",
        choices=CONFIG_KINDS,
        help="--launcher accelerate without --accelerate-config: the config generated for the "
        "cluster (default ddp; fsdp and deepspeed as accelerate writes them)",
    )


def require(parser: argparse.ArgumentParser, dest: str) -> None:
    """`--<dest>` must be given (in any of its spellings): checked by main() after parsing."""
    parser.set_defaults(_required=(dest,), _parser=parser)


def check_required(args: argparse.Namespace) -> None:
    for dest in getattr(args, "_required", ()):
        if getattr(args, dest, None) is None:
            flag = "--" + dest.replace("_", "-")
            args._parser.error(f"the following arguments are required: {flag}")


def master_port(
    parser: argparse.ArgumentParser, *, what: str = "rendezvous port on the head"
) -> None:
    parser.add_argument(
        "--master-port",
        type=PORT,
        default=None,
        help=f"{what} (default: the inventory's dscluster_master_port, else {DEFAULT_MASTER_PORT})",
    )
    alias(parser, "--port", dest="master_port", type=PORT)


def slots(parser: argparse.ArgumentParser, *, default: int | None, help: str) -> None:
    parser.add_argument("--slots", type=SLOTS, default=default, help=help)
    alias(parser, "--cpu-slots", "--slots-per-node", dest="slots", type=SLOTS)


def zero_stages(text: str) -> tuple[int, ...]:
    """argparse type of --zero: `2` or `1,2,3` -> the stages, in order, each once."""
    stages: list[int] = []
    for raw in str(text).split(","):
        part = raw.strip()
        if not (part.isascii() and part.isdigit()) or int(part) not in ZERO_STAGES:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {part!r} (choose ZeRO stages from 1, 2, 3, comma-separated)"
            )
        if int(part) not in stages:
            stages.append(int(part))
    return tuple(stages)


def zero(parser: argparse.ArgumentParser, *, help: str) -> None:
    parser.add_argument("--zero", type=zero_stages, default=(2,), help=help)


def offload(parser: argparse.ArgumentParser, *, default: str | None, help: str) -> None:
    parser.add_argument("--offload", choices=OFFLOADS, default=default, help=help)


def out(parser: argparse.ArgumentParser, *, help: str, old: Sequence[str] = (), **kwargs) -> None:
    """-o/--out: what dscluster writes (a file, or an inventory directory)."""
    parser.add_argument("-o", "--out", default=None, help=help, **kwargs)
    if old:
        alias(parser, *old, dest="out", **kwargs)


def ssh(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", help="SSH user Ansible logs in as (ansible_user)")
    # Both must exist: cli/inventory.check_static_or_slurm refuses them before anything runs.
    parser.add_argument("--key-file", help="SSH private key (ansible_ssh_private_key_file)")
    parser.add_argument(
        "--known-hosts",
        help="known_hosts holding the nodes' host keys (UserKnownHostsFile); checking stays on",
    )


def as_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def no_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-doctor", action="store_true", help="skip the doctor checks run before the job"
    )


def exclude_unhealthy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exclude-unhealthy",
        action="store_true",
        help="leave the nodes doctor fails (or would isolate) out of this run instead of "
        "stopping: the run's own hostfile lacks them, the inventory's stays; never the head",
    )


def check_exclude_unhealthy(args: argparse.Namespace) -> None:
    """--exclude-unhealthy acts on doctor's report: refused with --no-doctor."""
    from ..doctor.run import NO_DOCTOR_EXCLUDE  # noqa: PLC0415

    if args.exclude_unhealthy and args.no_doctor:
        raise DsclusterError(NO_DOCTOR_EXCLUDE)


def restart_options(
    parser: argparse.ArgumentParser,
    *,
    max_default: int | None,
    min_default: int | None,
    max_help: str,
    min_help: str,
    dir_help: str,
) -> None:
    """--max-restarts, --min-nodes and --checkpoint-dir, launch's and sbatch's (each says what
    a restart is for it; the bounds are one)."""
    parser.add_argument(
        "--max-restarts",
        type=validate.count_type(
            0, validate.MAX_RESTARTS, "a restart count", 3, flag="--max-restarts"
        ),
        default=max_default,
        help=max_help,
    )
    parser.add_argument(
        "--min-nodes",
        type=validate.count_type(1, validate.MAX_NODES, "a node count", 2, flag="--min-nodes"),
        default=min_default,
        help=min_help,
    )
    parser.add_argument("--checkpoint-dir", metavar="DIR", default="", help=dir_help)


def nnodes_type(text: str) -> tuple[int, int]:
    """argparse type of --nnodes: `N` or `MIN:MAX` -> (MIN, MAX), 1 <= MIN <= MAX."""
    raw = str(text).strip()
    parts = raw.split(":")
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"--nnodes {text!r} is not MIN:MAX or N; give whole node counts, e.g. --nnodes 2:3"
        )
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise argparse.ArgumentTypeError(
            f"--nnodes {raw}: a job needs at least 1 node; give MIN from 1, "
            f"e.g. --nnodes 1:{high or 2}"
        )
    if low > high:
        raise argparse.ArgumentTypeError(
            f"--nnodes {raw}: MIN {low} is above MAX {high}; give MIN:MAX with MIN <= MAX, "
            f"e.g. --nnodes {high}:{low}"
        )
    if high > validate.MAX_NODES:
        raise argparse.ArgumentTypeError(
            f"--nnodes {raw}: MAX is above {validate.MAX_NODES} nodes; give the nodes you select"
        )
    return low, high


def nnodes(parser: argparse.ArgumentParser) -> None:
    """launch's --nnodes MIN:MAX: torchrun's elastic mode, its agents restarting the workers
    --max-restarts times."""
    parser.add_argument(
        "--nnodes",
        metavar="MIN:MAX",
        type=nnodes_type,
        default=None,
        help="--launcher torchrun: torchrun's elastic mode; when a node is lost the agents "
        "restart the workers (--max-restarts times) on the nodes left while MIN are; MAX is "
        "the nodes selected. N alone: the N selected nodes, fixed",
    )


def check_nnodes(args: argparse.Namespace) -> None:
    """--nnodes is torchrun's: refused with any other launcher, and with the relaunch's own
    options (its restarts are the agents')."""
    given = getattr(args, "nnodes", None)
    if given is None:
        return
    low, high = given
    text = str(low) if low == high else f"{low}:{high}"
    if args.launcher != "torchrun":
        raise DsclusterError(
            f"--nnodes {text} is torchrun's elastic mode and --launcher is {args.launcher}; "
            "add --launcher torchrun or leave --nnodes out"
        )
    # With --nnodes torchrun's agents do the restarts, not launch's relaunch of the job.
    if getattr(args, "retry_on_error", False):
        raise DsclusterError(
            f"--retry-on-error relaunches the job, and with --nnodes {text} torchrun's agents "
            "restart the workers after any failure instead; leave --retry-on-error out"
        )
    if getattr(args, "min_nodes", 1) != 1:
        raise DsclusterError(
            f"--min-nodes {args.min_nodes} is the relaunch's; with --nnodes the agents go on "
            f"while MIN nodes are left: give --nnodes {args.min_nodes}:{high} instead"
        )


def torchrun_restarts(args: argparse.Namespace) -> int:
    """torchrun's own --max-restarts: launch's --max-restarts with --nnodes, else 0."""
    return int(args.max_restarts) if args.nnodes is not None else 0


def preflight(
    args: argparse.Namespace, inv: Inventory, *, master_port: int, console: Console, what: str
) -> Callable[[], list[Excluded]] | None:
    """The doctor run before a job as --no-doctor / --exclude-unhealthy ask (doctor.preflight)."""
    from ..doctor import preflight as doctor_preflight  # noqa: PLC0415

    return doctor_preflight(
        inv,
        master_port=master_port,
        console=console,
        what=what,
        skip=args.no_doctor,
        exclude_unhealthy=args.exclude_unhealthy,
    )


def timeout(parser: argparse.ArgumentParser, default: int | None, what: str = "the job") -> None:
    parser.add_argument(
        "--timeout",
        type=validate.seconds_type("seconds", flag="--timeout"),
        default=default,
        help=f"seconds before {what} is cut",
    )


def program(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- script.py [args...]")


def after_dashes(words: Sequence[str]) -> list[str]:
    """The user's program: what follows `--`."""
    words = list(words)
    return words[1:] if words[:1] == ["--"] else words
