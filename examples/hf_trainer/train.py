"""Hugging Face Trainer + DeepSpeed, as seed 002 runs it: `--deepspeed ds_config.json` with
"auto" values the Trainer fills in. A small GPT-2 built from its config on synthetic data made
here (nothing is downloaded), so it runs on any dscluster cluster, CPU-only included.

    dscluster launch -i INV --workdir examples/hf_trainer -- train.py --deepspeed ds_config.json

With DSCLUSTER_CHECKPOINT_DIR set (`dscluster launch --max-restarts N`), it saves a
checkpoint-N there every 10 steps and resumes from the newest complete one.

Every rank prints one `RESULT {...}` line: the world size the Trainer itself sees
(`args.world_size`), the host, and its first and last logged training loss.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import sys

import torch
from accelerate import PartialState
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

VOCAB, SEQ, SAMPLES = 64, 32, 768


class Sequences(torch.utils.data.Dataset):
    """Arithmetic token sequences (start + k * step, mod VOCAB): learnable in a few steps."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
        step = torch.randint(1, 4, (SAMPLES, 1), generator=g)
        self.ids = (start + step * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def deepspeed_on_cpu() -> list[str]:
    """CPU-only nodes: start Accelerate's state the way DeepSpeed needs it, before the Trainer
    (the Trainer's own `use_configured_state` route); the arguments that make it use it.

    Accelerate (1.x) gives DeepSpeed no process-group backend when there is no GPU, so the
    Trainer would count a world size of 1 (and fill "auto" batch sizes for it) while DeepSpeed
    sees every rank; and with ACCELERATE_USE_CPU=true (dscluster's CPU profile) it drops
    DeepSpeed altogether. GPU and Gaudi nodes need none of this.
    """
    if torch.cuda.is_available() or "--deepspeed" not in sys.argv:
        return []
    os.environ.pop("ACCELERATE_USE_CPU", None)
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    return ["--accelerator_config", json.dumps({"use_configured_state": True})]


def last_checkpoint(root: str) -> str | None:
    """The newest checkpoint-N the Trainer finished (it writes trainer_state.json last)."""
    done = glob.glob(os.path.join(root, "checkpoint-*", "trainer_state.json"))
    return max(
        (os.path.dirname(p) for p in done), key=lambda d: int(d.rsplit("-", 1)[1]), default=None
    )


def main() -> int:
    defaults = ["--output_dir", "out", "--max_steps", "30", "--learning_rate", "3e-3"]
    # One warmup step: the Trainer fills ds_config.json's "auto" warmup_num_steps with it, and
    # DeepSpeed 0.19.6+ refuses 0 (transformers before about 5.2x filled 0 when no warmup was
    # asked for: "warmup_num_steps must be a positive integer", seen with 5.17 on a GPU).
    defaults += ["--warmup_steps", "1"]
    defaults += ["--per_device_train_batch_size", "4", "--logging_steps", "1"]
    defaults += ["--save_strategy", "no", "--report_to", "none", "--seed", "0"]
    defaults += deepspeed_on_cpu()
    # Only under launch --max-restarts (DSCLUSTER_RESTART set): every job's .deepspeed_env
    # names the site's checkpoint dir, and a plain run must not resume an earlier one.
    restarting = "DSCLUSTER_RESTART" in os.environ
    resume_dir = os.environ.get("DSCLUSTER_CHECKPOINT_DIR") if restarting else None
    if resume_dir:
        defaults += ["--output_dir", resume_dir, "--save_strategy", "steps", "--save_steps", "10"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        defaults + sys.argv[1:]
    )
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Sequences())
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir) if resume_dir else None)
    plugin = trainer.accelerator.state.deepspeed_plugin if trainer.is_deepspeed_enabled else None
    zero_stage = plugin.zero_stage if plugin is not None else None
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    report = {
        "framework": "transformers.Trainer",
        "rank": args.process_index,
        "world_size": args.world_size,
        "host": socket.gethostname(),
        "deepspeed": trainer.is_deepspeed_enabled,
        "zero_stage": zero_stage,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    print("RESULT " + json.dumps(report), flush=True)
    trainer.accelerator.wait_for_everyone()
    # Leave without running any destructor, as examples/accelerate/train.py does: on gloo
    # (CPU) torch's teardown of the process group at interpreter exit may meet gloo's worker
    # thread still running ("terminate called without an active exception", the rank killed
    # by SIGABRT after it trained and reported: 1 run here on a loaded 2-core host). Every
    # rank is past the barrier above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
