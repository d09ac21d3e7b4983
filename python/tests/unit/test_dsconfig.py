"""dscluster dsconfig: the config forms, precision by accelerator, storage-dependent
checkpoint settings, and the judgement of the on-cluster checks (pure parts)."""

from __future__ import annotations

import json
import sys
import types
import typing

import pytest

from dscluster import dsconfig, runner, storage
from dscluster.errors import DsclusterError
from dscluster.jobs import dsconfig_check
from dscluster.node_facts import NodeFacts
from dscluster.smoke.run import checked_ds_config

from .clirun import run_cli
from .facts import write_facts

SHARED = storage.paths({"dscluster_shared_storage": "nfs"})
LOCAL = storage.paths({"dscluster_shared_storage": "none"})


def node(host: str, kind: str = "cuda", count: int = 8, models: tuple[str, ...] = ()) -> NodeFacts:
    return NodeFacts(
        host=host,
        accelerator=kind,
        accelerator_count=count,
        cpu_slots=2,
        interface="eth0",
        address="10.0.0.1",
        venv="/opt/dscluster/venv",
        torch_extensions_dir="/opt/dscluster/torch_extensions",
        cpus=16,
        versions={},
        models=models,
    )


def build(**kw):
    args = {
        "zero": 3,
        "offload": "none",
        "precision": "bf16",
        "accelerator": "cuda",
        "world_size": 16,
        "paths": SHARED,
    }
    args.update(kw)
    return dsconfig.build_config(**args)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (
            [node("a", models=("NVIDIA A100-SXM4-40GB",)), node("b", models=("NVIDIA H100",))],
            "bf16",
        ),
        ([node("a", models=("Tesla V100-SXM2-32GB",)), node("b", models=("NVIDIA A10G",))], "fp16"),
        ([node("a", models=("Tesla T4",))], "fp16"),
        ([node("a", "hpu", models=("HL-225",))], "bf16"),
        ([node("a", "cpu", 0), node("b", "cpu", 0)], "fp32"),
    ],
)
def test_precision_by_accelerator(facts, expected):
    assert dsconfig.precision_for(facts)[0] == expected


def test_mixed_accelerators_are_refused_naming_nodes():
    with pytest.raises(DsclusterError, match="a: cuda, b: cpu"):
        dsconfig.precision_for([node("a"), node("b", "cpu", 0)])


def test_batch_is_consistent_with_the_world():
    cfg = build(micro_batch=4, grad_accum=8, world_size=12)
    assert cfg["train_batch_size"] == 4 * 8 * 12
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["gradient_accumulation_steps"] == 8


def test_zero3_nvme_form():
    cfg = build(offload="nvme", nvme_path="/local_nvme", accelerator="cuda")
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "nvme"
    assert zero["offload_optimizer"]["nvme_path"] == "/local_nvme"
    assert zero["offload_param"] == {
        "device": "nvme",
        "nvme_path": "/local_nvme",
        "pin_memory": True,
        "buffer_count": 5,
        "buffer_size": 100_000_000,
        "max_in_cpu": 1_000_000_000,
    }
    assert cfg["aio"]["block_size"] == 1048576 and cfg["aio"]["queue_depth"] == 8
    assert cfg["bf16"] == {"enabled": True} and "fp16" not in cfg


def test_cpu_nodes_do_not_pin_and_use_fp32():
    cfg = build(offload="cpu", accelerator="cpu", precision="fp32")
    zero = cfg["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert "bf16" not in cfg and "fp16" not in cfg
    assert "aio" not in cfg


def test_stage2_cpu_offload_has_no_param_offload():
    zero = build(zero=2, offload="cpu")["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in zero
    assert zero["reduce_scatter"] is True


def test_fp16_block_has_dynamic_loss_scaling():
    cfg = build(precision="fp16")
    assert cfg["fp16"]["enabled"] is True and cfg["fp16"]["loss_scale"] == 0


def test_checkpoint_settings_follow_storage():
    assert build(paths=SHARED)["checkpoint"] == {
        "tag_validation": "Fail",
        "use_node_local_storage": False,
    }
    assert build(paths=LOCAL)["checkpoint"]["use_node_local_storage"] is True


@pytest.mark.parametrize("zero", [1, 2])
def test_nvme_needs_zero3(zero):
    with pytest.raises(DsclusterError, match="--offload nvme needs --zero 3"):
        build(zero=zero, offload="nvme", nvme_path="/nvme")


def test_nvme_path_on_shared_storage_is_refused():
    with pytest.raises(DsclusterError, match=r"is on shared storage \(nfs at /shared\)"):
        dsconfig.check_nvme_path("/shared/nvme", SHARED)
    dsconfig.check_nvme_path("/shared/nvme", LOCAL)  # a plain local dir without shared storage
    dsconfig.check_nvme_path("/var/lib/dscluster/scratch", SHARED)
    with pytest.raises(DsclusterError, match="not an absolute path"):
        dsconfig.check_nvme_path("nvme", SHARED)


def good(host_is_head: bool) -> dict:
    res = {
        "nvme": {"path": "/s", "writable": True, "free_bytes": 50 << 30, "error": ""},
        "async_io": {"installed": True, "usable": True, "error": ""},
    }
    if host_is_head:
        res["validate"] = {
            "ok": True,
            "zero_stage": 3,
            "train_batch_size": 3,
            "micro_batch": 1,
            "grad_accum": 1,
            "offload_optimizer": "nvme",
            "offload_param": "nvme",
            "bf16": False,
            "fp16": False,
            "use_node_local_storage": False,
            "bf16_supported": True,
            "accelerator": "cpu",
            "torch": "2.13.0",
        }
    return res


def judge(results, **kw):
    args = {
        "hosts": ["n1", "n2", "n3"],
        "head": "n1",
        "offload": "nvme",
        "precision": "fp32",
        "precision_auto": True,
    }
    args.update(kw)
    return dsconfig.judge(results, **args)


def test_judge_all_good():
    problems, notes = judge({h: good(h == "n1") for h in ("n1", "n2", "n3")})
    assert problems == []
    assert "accepts it: ZeRO-3" in notes[0]


def test_judge_names_the_node_for_each_problem():
    results = {h: good(h == "n1") for h in ("n1", "n2", "n3")}
    results["n2"]["nvme"] = {"path": "/s", "writable": False, "error": "does not exist"}
    results["n3"]["async_io"] = {"usable": False, "error": "undefined symbol: io_submit"}
    results["n1"]["validate"] = {"ok": False, "error": "ValidationError: stage 7"}
    problems, _ = judge(results)
    assert any(p.startswith("n2: NVMe path /s does not exist") for p in problems)
    assert any(
        p.startswith("n3: DeepSpeed's async_io op does not load (undefined") for p in problems
    )
    assert any(p.startswith("n1: DeepSpeed rejects the config: ValidationError") for p in problems)


def test_judge_small_disk_and_missing_node():
    results = {h: good(h == "n1") for h in ("n1", "n2")}
    results["n2"]["nvme"]["free_bytes"] = 100 << 20
    problems, _ = judge(results)
    assert any(p.startswith("n2: NVMe path /s has only 0.1 GiB free") for p in problems)
    assert any(p.startswith("n3: the check did not run (no check result)") for p in problems)


def test_judge_without_nvme_ignores_the_disk():
    results = {h: good(h == "n1") for h in ("n1", "n2", "n3")}
    results["n2"]["nvme"] = {"writable": False, "error": "does not exist"}
    assert judge(results, offload="cpu")[0] == []


def test_judge_bf16_unsupported():
    results = {h: good(h == "n1") for h in ("n1", "n2", "n3")}
    results["n1"]["validate"]["bf16_supported"] = False
    problems, _ = judge(results, precision="bf16")
    assert any("bf16 is not supported" in p and "--precision fp16" in p for p in problems)


def test_locked_bytes_follow_buffers_and_dtype():
    cfg = build(offload="nvme", nvme_path="/n", precision="fp32", nvme_buffer_size=1000)
    assert dsconfig.locked_bytes(cfg) == 5 * 1000 * 4
    cfg = build(offload="nvme", nvme_path="/n", precision="bf16", nvme_buffer_size=1000)
    assert dsconfig.locked_bytes(cfg) == 5 * 1000 * 2
    assert dsconfig.locked_bytes(build(offload="cpu")) == 0


def test_judge_memlock_below_the_swap_buffers_names_node_and_size():
    results = {h: good(h == "n1") for h in ("n1", "n2", "n3")}
    results["n1"]["memlock"] = {
        "bytes": {"n1": -1, "n2": 8 << 20},
        "errors": {"n3": "ssh: connect to host n3 port 22: Connection refused"},
    }
    locked = 5 * 1_000_000 * 4  # 20 MB
    problems, _ = judge(results, locked=locked, buffer_size=1_000_000)
    assert not any(p.startswith("n1:") for p in problems)
    (n2,) = [p for p in problems if p.startswith("n2:")]
    assert "locks 19 MiB per rank" in n2 and "ulimit -l is 8 MiB" in n2
    assert f"at most {1_000_000 * (8 << 20) // locked} here" in n2
    (n3,) = [p for p in problems if p.startswith("n3:")]
    assert "locked-memory limit unknown (ssh: connect to host n3" in n3
    # without NVMe param offload nothing is locked and memlock is not judged
    assert judge(results, offload="cpu")[0] == []


# The HF DeepSpeed guide's ZeRO-3 example (its "auto" values; NVMe paths as given there).
HF_GUIDE_ZERO3 = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


def test_hf_form_says_auto_where_the_hf_guide_does():
    cfg = build(offload="cpu", hf=True)
    assert set(dsconfig.auto_keys(cfg)) == {*dsconfig.auto_keys(HF_GUIDE_ZERO3), "bf16.enabled"}
    # what only the cluster knows stays as built: ZeRO stage, offload, checkpoints
    plain = build(offload="cpu")
    assert cfg["zero_optimization"]["offload_param"] == plain["zero_optimization"]["offload_param"]
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["checkpoint"] == plain["checkpoint"]
    assert cfg["fp16"]["initial_scale_power"] == 16
    stage2 = build(zero=2, hf=True)
    assert stage2["zero_optimization"]["reduce_bucket_size"] == 200_000_000  # ZeRO-3's only
    assert stage2["train_batch_size"] == "auto" and stage2["bf16"] == {"enabled": "auto"}


def test_fill_auto_as_the_trainer_with_default_arguments():
    values = dsconfig_check.hf_auto_values(world_size=3)
    for cfg in (HF_GUIDE_ZERO3, build(offload="cpu", hf=True, world_size=3)):
        filled, keys, unknown = dsconfig_check.fill_auto(cfg, values)
        assert unknown == [] and dsconfig.auto_keys(filled) == []
        assert set(keys) == set(dsconfig.auto_keys(cfg))
        assert filled["train_batch_size"] == 3 * 1 * 1
        assert filled["train_micro_batch_size_per_gpu"] == 1
        assert filled["optimizer"]["params"]["betas"] == [0.9, 0.999]
        assert filled["fp16"]["enabled"] is False
        assert filled["zero_optimization"]["reduce_bucket_size"] == 1024 * 1024
        assert filled["zero_optimization"]["stage3_max_live_parameters"] == 1e9  # untouched
    odd = {"train_batch_size": 8, "zero_optimization": {"stage": 2, "round_robin": "auto"}}
    _, keys, unknown = dsconfig_check.fill_auto(odd, values)
    assert (keys, unknown) == ([], ["zero_optimization.round_robin"])


class _FakeConfig:
    seen: typing.ClassVar[list] = []

    def __init__(self, config, mpu=None):
        self.seen.append(config)
        zero = types.SimpleNamespace(offload_optimizer=None, offload_param=None)
        self.zero_config = zero
        self.zero_optimization_stage = config["zero_optimization"]["stage"]
        self.train_batch_size = config["train_batch_size"]
        self.train_micro_batch_size_per_gpu = config["train_micro_batch_size_per_gpu"]
        self.gradient_accumulation_steps = config["gradient_accumulation_steps"]
        self.bfloat16_config = types.SimpleNamespace(enabled=config.get("bf16", {}).get("enabled"))
        self.float16_config = types.SimpleNamespace(enabled=config.get("fp16", {}).get("enabled"))
        self.aio_config = {}
        self.use_node_local_storage = False
        self.checkpoint_tag_validation_fail = True
        if (
            mpu.get_data_parallel_world_size()
            * self.train_micro_batch_size_per_gpu
            * (self.gradient_accumulation_steps)
            != self.train_batch_size
        ):
            raise AssertionError("train_batch_size is not micro x accum x world")


@pytest.fixture
def fake_deepspeed(monkeypatch):
    """Just enough of torch and DeepSpeed for dsconfig_check.validate, DeepSpeedConfig
    recording what it was given (neither is installed where the unit tests run)."""
    dist = types.SimpleNamespace(is_initialized=lambda: True)
    mods = {
        "torch": types.SimpleNamespace(__version__="2.13.0", distributed=dist),
        "torch.distributed": dist,
        "deepspeed": types.SimpleNamespace(init_distributed=lambda **kw: None),
        "deepspeed.runtime": types.SimpleNamespace(),
        "deepspeed.runtime.config": types.SimpleNamespace(DeepSpeedConfig=_FakeConfig),
        "deepspeed.accelerator": types.SimpleNamespace(get_accelerator=None),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    _FakeConfig.seen = []
    return _FakeConfig.seen


def test_validate_fills_auto_before_deepspeed_sees_it(tmp_path, fake_deepspeed):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(build(offload="cpu", hf=True, world_size=3)))
    out = dsconfig_check.validate(str(path), 3)
    assert out["ok"], out
    assert "train_batch_size" in out["auto_filled"] and "bf16.enabled" in out["auto_filled"]
    assert dsconfig.auto_keys(fake_deepspeed[0]) == []
    assert out["train_batch_size"] == 3
    # a plain config goes through as it is
    path.write_text(json.dumps(build(world_size=3)))
    out = dsconfig_check.validate(str(path), 3)
    assert out["ok"] and out["auto_filled"] == []
    # an "auto" the Trainer does not fill is named, DeepSpeed never called
    path.write_text(json.dumps({**build(world_size=3), "steps_per_print": "auto"}))
    out = dsconfig_check.validate(str(path), 3)
    assert not out["ok"] and out["error"].startswith('steps_per_print "auto"')
    assert len(fake_deepspeed) == 2


def test_judge_notes_the_filled_auto_values():
    results = {h: good(h == "n1") for h in ("n1", "n2", "n3")}
    results["n1"]["validate"]["auto_filled"] = ["train_batch_size", "bf16.enabled"]
    problems, notes = judge(results)
    assert problems == []
    assert notes[0].startswith('2 "auto" value(s) filled as the HF Trainer would')
    assert notes[0].endswith(": train_batch_size, bf16.enabled")
    assert "precision from the Trainer's --bf16/--fp16" in notes[1]


def test_dsconfig_hf_writes_the_trainer_form(inventory_dir):
    write_facts(inventory_dir / "facts", "node-c", kind="cuda", count=2)  # one kind
    rc, out, err = run_cli(
        "dsconfig", "-i", str(inventory_dir), "--zero", "3", "--hf", "--no-check"
    )
    assert rc == 0, err
    path = inventory_dir / "dsconfig" / "ds_config_zero3_hf.json"
    assert out.strip() == f"wrote {path}"
    cfg = json.loads(path.read_text())
    assert cfg["train_micro_batch_size_per_gpu"] == "auto"
    assert cfg["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"
    assert 'HF Trainer form: batch, clipping, optimizer, scheduler and precision are "auto"' in err


def test_smoke_refuses_an_auto_config(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(HF_GUIDE_ZERO3))
    with pytest.raises(DsclusterError) as exc:
        checked_ds_config(path)
    msg = str(exc.value)
    assert '"auto" values (fp16.enabled, optimizer.params.lr, optimizer.params.betas and ' in msg
    assert "the smoke job does not" in msg and "without --hf" in msg
    path.write_text(json.dumps(build()))
    assert checked_ds_config(path) == path


@pytest.mark.parametrize(
    ("failures", "reason"),
    [
        # The run itself failed (host "-"): its reason is every node's, not "no check result".
        ([("-", "dsconfig.yml", "ERROR! the inventory could not be parsed")],
         "the check did not run (dsconfig.yml: ERROR! the inventory could not be parsed)"),
        # A run that ended well but reached none of the nodes.
        ([], "the check did not run (dsconfig.yml (successful, rc 0) ran no task on it)"),
    ],
)  # fmt: skip
def test_a_check_run_that_reached_no_node_says_why_for_each(
    inventory_dir, monkeypatch, failures, reason
):
    def fake_run(playbook, inv, **kwargs):
        assert playbook == "dsconfig.yml"
        rc = 2 if failures else 0
        status = "failed" if failures else "successful"
        hosts = {h: runner.HostSummary() for h in inv.hosts}
        return runner.PlaybookResult(status=status, rc=rc, hosts=hosts, failures=failures)

    write_facts(inventory_dir / "facts", "node-c", kind="cuda", count=2)  # one kind
    monkeypatch.setattr(runner, "run_playbook", fake_run)
    rc, _, err = run_cli("dsconfig", "-i", str(inventory_dir), "--zero", "2")
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert "3 problem(s), nothing written" in line, line
    for host in ("node-a", "node-b", "node-c"):
        assert f"{host}: {reason}" in line, line
    assert "no check result" not in line
    assert not (inventory_dir / "dsconfig").exists()


def test_results_come_from_the_runs_custom_stats_and_a_bad_line_is_named(
    inventory_dir, monkeypatch
):
    """The play hands {host: the check's JSON line} over as its custom stats: a line that is
    not JSON is that node's problem, a node with no line says the check gave none."""

    def fake_run(playbook, inv, **kwargs):
        assert "dsconfig_out_dir" not in kwargs["extravars"]
        hosts = {h: runner.HostSummary(ok=1) for h in inv.hosts}
        handed = {"node-a": '{"user": "ds"}', "node-b": "Traceback (most recent call last):"}
        return runner.PlaybookResult(
            status="successful", rc=0, hosts=hosts, failures=[],
            artifacts={"dsconfig_results": handed},
        )  # fmt: skip

    write_facts(inventory_dir / "facts", "node-c", kind="cuda", count=2)
    monkeypatch.setattr(runner, "run_playbook", fake_run)
    rc, _, err = run_cli("dsconfig", "-i", str(inventory_dir), "--zero", "2")
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert "2 problem(s), nothing written" in line, line
    assert "node-b: the check did not run (unreadable check output (Expecting value" in line, line
    assert "node-c: the check did not run (no check result)" in line, line
    assert "node-a:" not in line, line
    assert not (inventory_dir / "dsconfig").exists()
