"""`dscluster dsconfig`: a DeepSpeed config (ZeRO 1/2/3, offload) checked on the cluster."""

from __future__ import annotations

import argparse
import json
import re

from rich.console import Console

from .. import validate
from ..errors import DsclusterError
from . import flags

NVME_PATH_RE = re.compile(r"/[^\s,:]*")


def register(sub) -> None:
    from ..dsconfig import PRECISIONS  # noqa: PLC0415

    p = sub.add_parser(
        "dsconfig",
        help="write a DeepSpeed config (ZeRO 1/2/3, CPU/NVMe offload) checked on the cluster",
    )
    flags.inventory(p)
    flags.zero(p, help="ZeRO stage of the config: 1, 2 (default) or 3 (one stage: one config)")
    flags.offload(p, default="none", help="optimizer (and ZeRO-3 parameter) offload")
    p.add_argument(
        "--precision", choices=PRECISIONS, default="auto", help="auto: by accelerator (default)"
    )
    p.add_argument(
        "--micro-batch",
        type=validate.count_type(1, 1 << 20, "a batch size per rank", 1, flag="--micro-batch"),
        default=None,
        help="per rank (default 1)",
    )
    p.add_argument(
        "--grad-accum",
        type=validate.count_type(1, 1 << 20, "a step count", 1, flag="--grad-accum"),
        default=None,
        help="gradient accumulation steps (default 1)",
    )
    p.add_argument(
        "--lr",
        type=validate.real_type(0, 10, "a learning rate", "1e-4", lo_open=True, flag="--lr"),
        default=None,
        help="AdamW learning rate (default 1e-4)",
    )
    p.add_argument(
        "--nvme-path",
        default=None,
        help="node-local NVMe directory (dscluster_scratch_dir); only with --offload nvme",
    )
    p.add_argument(
        "--nvme-buffer-size",
        type=validate.count_type(
            1, 1 << 40, "a number of elements", 100_000_000, flag="--nvme-buffer-size"
        ),
        default=100_000_000,
        help="offload_param buffer_size in elements (>= the largest parameter)",
    )
    flags.out(p, help="where to write the JSON", type=validate.out_file_type("--out"))
    p.add_argument(
        "--no-check",
        action="store_true",
        help="write without running DeepSpeed's config check and the node checks",
    )
    p.add_argument(
        "--hf",
        action="store_true",
        help='the HF Trainer\'s form: batch, optimizer, scheduler and precision "auto", '
        "filled by the Trainer from its own arguments (transformers' DeepSpeed integration)",
    )
    p.add_argument("--print", action="store_true", help="also print the config on stdout")
    p.set_defaults(func=cmd_dsconfig, check=check_dsconfig)


def check_dsconfig(args: argparse.Namespace) -> None:
    if len(args.zero) != 1:
        stages = ",".join(map(str, args.zero))
        raise DsclusterError(
            f"--zero {stages}: a config has one ZeRO stage; write one per stage "
            "(dscluster smoke --zero takes a list and runs them all)"
        )
    given = [
        flag
        for flag, value in (
            ("--micro-batch", args.micro_batch),
            ("--grad-accum", args.grad_accum),
            ("--lr", args.lr),
        )
        if value is not None
    ]
    if args.hf and given:
        raise DsclusterError(
            f"--hf with {', '.join(given)}: the HF Trainer fills the batch and the learning "
            'rate ("auto") from its own arguments (--per_device_train_batch_size, '
            "--gradient_accumulation_steps, --learning_rate); drop " + ", ".join(given) + " or --hf"
        )
    if args.nvme_path is not None:
        if args.offload != "nvme":
            raise DsclusterError(
                f"--nvme-path {args.nvme_path} is used only with NVMe offload; add "
                "--offload nvme (with --zero 3), or drop --nvme-path"
            )
        if not NVME_PATH_RE.fullmatch(args.nvme_path):
            raise DsclusterError(
                f"--nvme-path {args.nvme_path!r} is not an absolute path without blanks; give "
                "a node-local directory, e.g. --nvme-path /local_nvme"
            )


def cmd_dsconfig(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..dsconfig import run_dsconfig  # noqa: PLC0415
    from ..inventory import load  # noqa: PLC0415

    inv = load(args.inventory)
    path, config, notes = run_dsconfig(
        inv,
        zero=args.zero[0],
        offload=args.offload,
        precision=args.precision,
        micro_batch=args.micro_batch or 1,
        grad_accum=args.grad_accum or 1,
        lr=args.lr or 1e-4,
        nvme_path=args.nvme_path,
        nvme_buffer_size=args.nvme_buffer_size,
        out=args.out,
        check=not args.no_check,
        hf=args.hf,
        console=err,
    )
    for note in notes:
        err.print(f"dsconfig: {note}", markup=False, highlight=False)
    if args.print:
        out.print_json(json.dumps(config))
    out.print(f"wrote {path}", markup=False, highlight=False)
    return 0
