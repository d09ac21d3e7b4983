"""An Accelerate training loop, as seed 003 runs it with `accelerate launch --config_file …`:
DDP or FSDP comes from the Accelerate config, not from the script. A small GPT-2 built from
its config on synthetic data made here (nothing is downloaded).

    dscluster launch -i INV --launcher accelerate --workdir examples/accelerate -- train.py
    dscluster launch -i INV --launcher accelerate --accelerate-config fsdp_config.yaml \\
        --workdir examples/accelerate -- train.py

With DSCLUSTER_CHECKPOINT_DIR set (`dscluster launch --max-restarts N`), it saves the whole
state there (accelerator.save_state) every --save-every steps and resumes from the newest.

Every rank prints one `RESULT {...}` line: the number of processes Accelerate itself sees
(`accelerator.num_processes`), its distributed type, the host, and the first and last loss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
from typing import NoReturn

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, SEQ, SAMPLES = 64, 32, 768


def sequences() -> torch.Tensor:
    """Arithmetic token sequences (start + k * step, mod VOCAB): learnable in a few steps."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
    step = torch.randint(1, 4, (SAMPLES, 1), generator=g)
    return (start + step * torch.arange(SEQ)) % VOCAB


def last_state(root: str) -> tuple[int, str | None]:
    """(step, directory) of the newest complete step_N under root; (0, None) when none."""
    saved = [int(m[1]) for d in os.listdir(root) if (m := re.fullmatch(r"step_(\d+)", d))]
    return (max(saved), os.path.join(root, f"step_{max(saved)}")) if saved else (0, None)


def save_state(accelerator: Accelerator, root: str, step: int) -> None:
    """Every rank saves into step_N.tmp; renamed once all have, so a cut-short save is never
    loaded."""
    accelerator.save_state(os.path.join(root, f"step_{step}.tmp"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        final = os.path.join(root, f"step_{step}")
        shutil.rmtree(final, ignore_errors=True)  # only left by a run that saved this step too
        os.replace(os.path.join(root, f"step_{step}.tmp"), final)
    accelerator.wait_for_everyone()


def main() -> NoReturn:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save-every", type=int, default=10, help="with DSCLUSTER_CHECKPOINT_DIR")
    args = parser.parse_args()
    # Only under launch --max-restarts (DSCLUSTER_RESTART set): every job's .deepspeed_env
    # names the site's checkpoint dir, and a plain run must not resume an earlier one.
    restarting = "DSCLUSTER_RESTART" in os.environ
    resume_dir = os.environ.get("DSCLUSTER_CHECKPOINT_DIR") if restarting else None

    accelerator = Accelerator()
    set_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(sequences()),
        batch_size=args.batch_size,
        shuffle=True,
    )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # DeepSpeed makes its engine from the model, the optimizer and the loader's batch
        # size in one prepare() (accelerate refuses a model prepared alone).
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        # FSDP wraps the model first; the optimizer is made from the wrapped parameters.
        model = accelerator.prepare(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        optimizer, loader = accelerator.prepare(optimizer, loader)

    done, state = last_state(resume_dir) if resume_dir and os.path.isdir(resume_dir) else (0, None)
    if state:
        accelerator.load_state(state)
    losses: list[float] = []
    model.train()
    # After a resume, the interrupted epoch is only as long as what was left of it.
    batches = accelerator.skip_first_batches(loader, done % len(loader)) if done else loader
    while done + len(losses) < args.steps:
        for (ids,) in batches:
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            # The mean over every process: each rank logs the same global loss.
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
            if resume_dir:  # the step marker the restart loop times the resumed run by
                if accelerator.is_main_process:
                    print(f"DSCLUSTER_STEP {done + len(losses)}", flush=True)
                if (done + len(losses)) % args.save_every == 0:
                    save_state(accelerator, resume_dir, done + len(losses))
            if done + len(losses) == args.steps:
                break
        batches = loader
    report = {
        "framework": "accelerate",
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "host": socket.gethostname(),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }
    print("RESULT " + json.dumps(report), flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    # Leave here, while the model is alive, without running any destructor. On gloo (CPU)
    # torch frees DDP's Reducer, and with it the process group, holding the GIL and joins
    # gloo's worker thread, which may still be freeing the barrier's prior allreduce and
    # its tensors, waiting for that GIL: a rank that hung after training when main()'s
    # locals were released (about 1 run in 5 on a loaded 2-core host; gdb: ~Reducer ->
    # ~ProcessGroupGloo -> std::thread::join against pt_gloo_runloop -> ~AsyncBarrierWork ->
    # decref_pyobject -> gil_scoped_acquire). Every rank is past the barrier above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
