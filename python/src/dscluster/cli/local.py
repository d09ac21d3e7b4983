"""`dscluster local up|down` (a local cluster of node containers) and `dscluster image`."""

from __future__ import annotations

import argparse
import re

from rich.console import Console

from .. import validate
from ..errors import DsclusterError
from ..sources.names import check_cluster_name
from ..validate import IMAGE_REF_RE
from . import flags

# Local clusters are containers on one machine: beyond this many, the machine is the limit.
MAX_LOCAL_NODES = 64
# Docker's --shm-size: a number with an optional unit b, k, m or g.
SHM_SIZE_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[bkmg]?)", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def shm_size_type(text: str) -> str:
    """--shm-size as Docker takes it, from 1m to 1t (checked here, before any container)."""
    m = SHM_SIZE_RE.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; give a number with b, k, m or g, e.g. --shm-size 1g"
        )
    size = float(m["number"]) * _UNIT[m["unit"].lower()]
    if not (1 << 20) <= size <= (1 << 40):
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range; give 1m to 1024g of /dev/shm, e.g. --shm-size 1g"
        )
    return text.strip()


def image_ref_type(text: str) -> str:
    if not IMAGE_REF_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Docker image reference; give name[:tag], e.g. debian:bookworm"
        )
    return text


# The Debian releases the roles have names for (their OS tables): a node image on another
# Debian tag would build, then fail in every role's preflight.
DEBIAN_RELEASES = {"bookworm": "12", "trixie": "13"}


def base_ref_type(text: str) -> str:
    """An image reference; on Debian's own image, a release the roles support."""
    ref = image_ref_type(text)
    name, _, tag = ref.partition(":")
    if name in ("debian", "library/debian", "docker.io/library/debian") and tag:
        release = re.split(r"[-.]", tag)[0]
        if release not in DEBIAN_RELEASES and release not in DEBIAN_RELEASES.values():
            choices = " or ".join(f"debian:{r} ({v})" for r, v in DEBIAN_RELEASES.items())
            raise argparse.ArgumentTypeError(
                f"{ref!r}: {tag} is not a Debian release dscluster supports; give {choices}"
            )
    return ref


def register(sub) -> None:
    local = sub.add_parser("local", help="local cluster of node containers")
    lsub = local.add_subparsers(dest="local_command", required=True)
    up = lsub.add_parser("up", help="create or reconcile a local cluster (idempotent)")
    up.add_argument(
        "--nodes",
        type=validate.count_type(1, MAX_LOCAL_NODES, "a node count", 3, flag="--nodes"),
        default=3,
        help="number of nodes (default 3)",
    )
    cluster_name = validate.name_type(check_cluster_name)
    up.add_argument(
        "--name", type=cluster_name, default="local", help="cluster name (default local)"
    )
    flags.slots(up, default=1, help="slots per CPU node (default 1)")
    up.add_argument(
        "--shm-size", type=shm_size_type, default="1g", help="/dev/shm size per node (default 1g)"
    )
    up.add_argument(
        "--image",
        type=image_ref_type,
        help="start the nodes from this image (one 'dscluster image bake' made) instead of "
        "the plain node image; remembered for later 'local up' runs of the cluster",
    )
    up.add_argument(
        "--base",
        type=base_ref_type,
        help="build the node image on this base (default debian:bookworm; debian:trixie for "
        "Debian 13 nodes); remembered for later 'local up' runs of the cluster",
    )
    up.set_defaults(func=cmd_local_up, check=check_local_up)
    down = lsub.add_parser("down", help="remove a local cluster and everything it made")
    down.add_argument("--name", type=cluster_name, default="local")
    down.set_defaults(func=cmd_local_down)

    image = sub.add_parser("image", help="make sure the node image exists (build it if not)")
    image.add_argument(
        "--base",
        type=base_ref_type,
        default="debian:bookworm",
        help="base image (pulled or built)",
    )
    image.set_defaults(func=cmd_image)
    isub = image.add_subparsers(dest="image_command", required=False)
    bake = isub.add_parser(
        "bake",
        help="make a provisioned node into an image of the whole stack (local: a Docker "
        "image; AWS: an AMI), for 'local up --image' / 'aws up --ami'",
    )
    flags.inventory(bake)
    bake.add_argument("--node", help="the node to bake (default: the first worker)")
    bake.add_argument(
        "--name",
        help="the image: a Docker tag (default dscluster/baked:<cluster>) or an AMI name "
        "(default dscluster-<cluster>-<UTC time>)",
    )
    bake.add_argument("--profile", help="AWS profile (AWS clusters; default: boto3's chain)")
    bake.set_defaults(func=cmd_image_bake, check=check_image_bake, bake=None)


def check_local_up(args: argparse.Namespace) -> None:
    if args.image and args.base:
        raise DsclusterError(
            f"--image {args.image} and --base {args.base} both given; give one: --image starts "
            "the nodes from a baked image, --base builds the node image on another base"
        )


def cmd_local_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import sources  # noqa: PLC0415

    described = sources.describe(
        "local",
        name=args.name,
        nodes=args.nodes,
        cpu_slots=args.slots,
        shm_size=args.shm_size,
        image=args.image,
        base_image=args.base,
        console=err,
    )
    path = sources.write(described).hosts_yml
    out.print(f"local cluster '{args.name}': {args.nodes} nodes, inventory {path}")
    return 0


def cmd_local_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources import local  # noqa: PLC0415

    removed = local.down(args.name, console=err)
    out.print(f"local cluster '{args.name}': removed {len(removed)} objects")
    return 0


def cmd_image(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources import local  # noqa: PLC0415

    local.ensure_engine()
    out.print(local.node_image(args.base, console=err))
    return 0


def check_image_bake(args: argparse.Namespace) -> None:
    from .. import bake  # noqa: PLC0415
    from ..inventory import load  # noqa: PLC0415

    args.bake = bake.check(load(args.inventory), node=args.node, name=args.name)


def cmd_image_bake(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import bake  # noqa: PLC0415

    plan = args.bake
    if plan.kind == "docker":
        bake.bake_docker(plan, err)
        out.print(
            f"baked {plan.name} from {plan.host} (torch {plan.versions['torch']}, deepspeed "
            f"{plan.versions['deepspeed']}); start a cluster from it: dscluster local up "
            f"--name NAME --image {plan.name}, then dscluster provision -i inventories/NAME"
        )
        return 0
    from ..sources.aws.session import session  # noqa: PLC0415

    ami = bake.bake_aws(plan, session(args.profile, plan.region or None), console=err)
    out.print(
        f"baked AMI {ami} ({plan.name}) from {plan.host}; start a cluster from it: dscluster "
        f"aws up --cluster NAME --ami {ami} ..."
    )
    return 0
