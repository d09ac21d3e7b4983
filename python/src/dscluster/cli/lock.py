"""`dscluster lock`: write the base layer's hash lock for a torch variant, Python and platform."""

from __future__ import annotations

import argparse
import pathlib

from rich.console import Console

from ..errors import DsclusterError


def register(sub) -> None:
    p = sub.add_parser(
        "lock",
        help="write the hash lock of torch + DeepSpeed for a variant and Python "
        "(ml_stack_base_lock_file)",
    )
    p.add_argument(
        "--variant",
        required=True,
        help="the torch build: cpu, cu126, cu128, cu130 (PyTorch's index) or pypi (PyPI's own)",
    )
    p.add_argument("--python", required=True, help="the nodes' Python: 3.10, 3.11, 3.12 or 3.13")
    p.add_argument("--arch", default="x86_64", help="x86_64 (default) or aarch64")
    p.add_argument("--index-url", default="", help="PyPI's mirror (default PyPI)")
    p.add_argument(
        "--extra-index-url", action="append", default=[], help="another index (repeatable)"
    )
    p.add_argument(
        "--torch-index-url",
        default="",
        help="PyTorch's index or its mirror; the variant is appended "
        "(default ml_stack_torch_index_url)",
    )
    p.add_argument(
        "-o",
        "--out",
        default="",
        help="the file to write, or a directory to write the name ml_stack looks for into "
        "(default: that name, here)",
    )
    p.set_defaults(func=cmd_lock, check=check_lock)


def _request(args: argparse.Namespace):
    from .. import paths  # noqa: PLC0415
    from ..lock import request_from  # noqa: PLC0415

    return request_from(
        paths.collection_root(),
        variant=args.variant,
        python=args.python,
        arch=args.arch,
        index_url=args.index_url,
        extra_index_urls=tuple(args.extra_index_url),
        torch_index_url=args.torch_index_url,
    )


def _target(args: argparse.Namespace, name: str) -> pathlib.Path:
    out = pathlib.Path(args.out or name).expanduser()
    return out / name if out.is_dir() else out


def check_lock(args: argparse.Namespace) -> None:
    req = _request(args)
    if not _target(args, req.name).parent.is_dir():
        raise DsclusterError(
            f"--out {args.out}: give a file in an existing directory or a directory, e.g. "
            f"--out ./{req.name}"
        )


def cmd_lock(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import paths  # noqa: PLC0415
    from ..lock import make_lock  # noqa: PLC0415

    req = _request(args)
    target = _target(args, req.name)
    err.print(
        f"locking {req.torch_spec}, DeepSpeed {req.deepspeed} and their requirements for "
        f"{req.pytag} {req.arch}",
        markup=False,
        highlight=False,
    )
    path = make_lock(req, paths.collection_root() / "roles/ml_stack/files/locks", target)
    out.print(
        f"wrote {path}: set ml_stack_base_lock_file to it (or ship it as "
        f"roles/ml_stack/files/locks/{req.name})",
        markup=False,
        highlight=False,
    )
    return 0
