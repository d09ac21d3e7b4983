"""--launcher accelerate: one `accelerate launch` per node (static rendezvous on the master),
started by pdsh through a node script as torchrun's; its config is the user's or one
generated for the selection (launch/accelerate.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import DsclusterError
from ..accelerate import CONFIG_NAME, check_cpu_config, extra_args, parse_config, render_config
from .base import Files, HeadCommand, Job
from .torchrun import render_torchrun_node_script, torchrun_pdsh_argv


def accelerate_argv(  # noqa: PLR0913 - one node's accelerate launch, each a keyword
    *,
    venv: str,
    config: str,
    machine_rank: int,
    master: str,
    master_port: int,
    num_machines: int,
    num_processes: int,
    extra: Sequence[str],
    program: Sequence[str],
) -> list[str]:
    """One node's `accelerate launch`: static rendezvous on the master (node rank
    `machine_rank`), `num_processes / num_machines` ranks per node (launch/accelerate.py)."""
    return [
        f"{venv}/bin/accelerate",
        "launch",
        "--config_file",
        config,
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        master,
        "--main_process_port",
        str(master_port),
        "--num_machines",
        str(num_machines),
        "--num_processes",
        str(num_processes),
        "--rdzv_backend",
        "static",
        "--same_network",
        "--max_restarts",
        "0",
        *extra,
        *program,
    ]


def render(job: Job, files: Files) -> HeadCommand:
    request, site = job.request, job.site
    counts = {len(s) for s in job.resources.values()}
    if len(counts) > 1:
        shown = ", ".join(f"{h} ({len(s)})" for h, s in job.resources.items())
        raise DsclusterError(
            f"--launcher accelerate runs the same number of ranks on every node, not {shown}; "
            "even them out with --num-gpus N or --include"
        )
    world = job.world_size
    kinds = {site.accelerators.get(h, "cpu") for h in job.resources}
    config_text = request.accelerate_config
    config_name = request.accelerate_config_name or "accelerate_config.yaml"
    if config_text:
        config = parse_config(config_text, config_name)
        if kinds == {"cpu"}:
            check_cpu_config(config, config_name)
    else:
        config_name = CONFIG_NAME
        config_text = render_config(
            request.accelerate_config_kind,
            kinds.pop() if len(kinds) == 1 else "cuda",
            num_machines=len(job.resources),
            num_processes=world,
        )
        config = parse_config(config_text, config_name)
    files[config_name] = (config_text, "0644")
    extra = extra_args(config, world)
    nodes = {
        host: (
            accelerate_argv(
                venv=site.venv,
                config=config_name,
                machine_rank=rank,
                master=job.master,
                master_port=request.master_port,
                num_machines=len(job.resources),
                num_processes=world,
                extra=extra,
                program=request.program,
            ),
            job.devices(host),
        )
        for rank, host in enumerate(job.resources)
    }
    files["accelerate_node.sh"] = (
        render_torchrun_node_script(
            run_id=site.run_id,
            job_dir=site.job_dir,
            env=job.env,
            nodes=nodes,
            name="accelerate_node.sh",
            agent="accelerate",
        ),
        "0755",
    )
    return HeadCommand(torchrun_pdsh_argv(list(job.resources), site.job_dir, "accelerate_node.sh"))
