"""A Lightning DDP script in seed 003's form: `--devices` per node and `--nodes`, given on
the command line; Lightning reads its ranks from the launcher (torchrun's environment, or
Slurm's under `srun`). A small GPT-2 built from its config on synthetic data made here.

    dscluster launch -i INV --launcher torchrun --workdir examples/lightning -- \\
        train.py --devices 2 --nodes 3
    dscluster launch -i INV --launcher deepspeed --workdir examples/lightning -- \\
        train.py --devices 2 --nodes 3
    dscluster sbatch -i INV --launcher srun --nodes 3 --slots 2 -- train.py --devices 2 --nodes 3

With DSCLUSTER_CHECKPOINT_DIR set (`dscluster launch --max-restarts N`), a ModelCheckpoint
keeps last.ckpt there (every --save-every steps) and fit resumes from it (ckpt_path="last").

Every rank prints one `RESULT {...}` line: the world size Lightning itself sees
(`trainer.world_size`), its global rank, the host, and its first and last loss.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, SEQ, SAMPLES = 64, 32, 768


def sequences() -> torch.Tensor:
    """Arithmetic token sequences (start + k * step, mod VOCAB): learnable in a few steps."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
    step = torch.randint(1, 4, (SAMPLES, 1), generator=g)
    return (start + step * torch.arange(SEQ)) % VOCAB


class TinyGPT(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
        self.model = GPT2LMHeadModel(config)
        self.lr = lr
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        loss = self.model(input_ids=ids, labels=ids).loss
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs) per node")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes")
    parser.add_argument("--accelerator", default="auto", help="gpu, cpu, hpu or auto")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save-every", type=int, default=10, help="with DSCLUSTER_CHECKPOINT_DIR")
    # DeepSpeed's launcher passes --local_rank=N to every script (LOCAL_RANK is in the env too).
    parser.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Only under launch --max-restarts (DSCLUSTER_RESTART set): every job's .deepspeed_env
    # names the site's checkpoint dir, and a plain run must not resume an earlier one.
    restarting = "DSCLUSTER_RESTART" in os.environ
    resume_dir = os.environ.get("DSCLUSTER_CHECKPOINT_DIR") if restarting else None
    every = dict(dirpath=resume_dir, save_last=True, every_n_train_steps=args.save_every)

    L.seed_everything(0)
    module = TinyGPT(args.lr)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(sequences()),
        batch_size=args.batch_size,
        shuffle=True,
    )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=bool(resume_dir),
        callbacks=[ModelCheckpoint(**every)] if resume_dir else None,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader, ckpt_path="last" if resume_dir else None)
    report = {
        "framework": "lightning",
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "cluster_environment": type(trainer.strategy.cluster_environment).__name__,
        "host": socket.gethostname(),
        # Each rank trains on its own shard: the mean of its first and last three steps.
        "first_loss": sum(module.losses[:3]) / 3,
        "last_loss": sum(module.losses[-3:]) / 3,
    }
    print("RESULT " + json.dumps(report), flush=True)
    trainer.strategy.barrier("result")
    # Leave without running any destructor, as examples/accelerate and examples/hf_trainer
    # do: on gloo (CPU) torch's teardown of DDP's process group at interpreter exit can meet
    # gloo's worker thread still running and end a rank that trained and reported with
    # SIGABRT ("terminate called without an active exception") or a hang. Every rank is
    # past the barrier above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
