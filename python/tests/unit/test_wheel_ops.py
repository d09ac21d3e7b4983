"""scripts/wheel_ops.py, make cuda-wheel's check of the DeepSpeed wheel it built: the ops and
their cubins' architectures read from the recorded `cuobjdump --list-elf` outputs and version
info of a CUDA build without a GPU (fixtures/cuda_build/), and the one line that names what a
wheel lacks."""

from __future__ import annotations

import json
import pathlib
import types
import zipfile

import pytest
import yaml

from .. import rolefiles

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "cuda_build"
CUDA_OPS = ["cpu_adam", "fused_adam", "fused_lamb"]  # what the recorded build asked for
ARCHS = "8.0;9.0"


@pytest.fixture(scope="module")
def wheel_ops() -> types.ModuleType:
    module = rolefiles.load_script("wheel_ops")
    return module


def list_elf(op: str) -> str:
    return (FIXTURES / f"cuobjdump_list_elf_{op}.txt").read_text()


def version_info() -> str:
    return (FIXTURES / "git_version_info_installed.py.txt").read_text()


def recorded_ops(wheel_ops, **edits: str) -> dict[str, list[str]]:
    """The recorded build's ops and archs, with any op's cuobjdump output replaced."""
    return {op: wheel_ops.parse_list_elf(edits.get(op, list_elf(op))) for op in CUDA_OPS}


def test_the_recorded_cubins_and_host_only_op(wheel_ops):
    assert wheel_ops.parse_list_elf(list_elf("fused_adam")) == ["sm_80", "sm_90"]
    assert wheel_ops.parse_list_elf(list_elf("fused_lamb")) == ["sm_80", "sm_90"]
    assert wheel_ops.parse_list_elf(list_elf("cpu_adam")) == []
    assert wheel_ops.format_op("cpu_adam", []) == "cpu_adam: host code only"
    assert wheel_ops.format_op("fused_adam", ["sm_80", "sm_90"]) == "fused_adam: sm_80 sm_90"
    # sm_100 sorts after sm_90, not between sm_10 and sm_80.
    elf = "".join(
        f"ELF file    {i}: k.{a}.cubin\n" for i, a in enumerate(["sm_100", "sm_90a", "sm_80"])
    )
    assert wheel_ops.parse_list_elf(elf) == ["sm_80", "sm_90a", "sm_100"]


def test_the_recorded_version_info(wheel_ops):
    info = wheel_ops.parse_version_info(version_info())
    assert info["accelerator_name"] == "cuda"
    assert info["torch_info"]["cuda_version"] == "13.0"
    assert sorted(op for op, on in info["installed_ops"].items() if on) == [
        "cpu_adam",
        "fused_adam",
        "fused_lamb",
    ]


@pytest.mark.parametrize(
    ("member", "op"),
    [
        ("deepspeed/ops/adam/fused_adam_op.cpython-311-x86_64-linux-gnu.so", "fused_adam"),
        ("deepspeed/ops/aio/async_io_op.cpython-311-x86_64-linux-gnu.so", "async_io"),
        ("deepspeed/ops/adam/fused_adam.py", None),
        ("deepspeed/accelerator/x.so", None),
    ],
)
def test_op_names(wheel_ops, member, op):
    assert wheel_ops.op_name(member) == op


def test_arch_lists(wheel_ops):
    assert wheel_ops.arch_list(ARCHS) == ["sm_80", "sm_90"]
    assert wheel_ops.arch_list("8.0 9.0a+PTX") == ["sm_80", "sm_90a"]
    assert wheel_ops.torch_arch("sm_90a") == "9.0a"
    with pytest.raises(wheel_ops.WheelOpsError, match="Hopper"):
        wheel_ops.arch_list("8.0;Hopper")


def test_the_recorded_build_has_what_it_asked_for(wheel_ops):
    ops = recorded_ops(wheel_ops)
    info = wheel_ops.parse_version_info(version_info())
    assert wheel_ops.problems(ops, info, CUDA_OPS, wheel_ops.arch_list(ARCHS), "cuda") == []


def test_a_cubin_dropped_is_named(wheel_ops):
    """The fault: the recorded fused_adam output without its sm_90 cubin."""
    without_90 = "".join(
        line for line in list_elf("fused_adam").splitlines(True) if "sm_90" not in line
    )
    assert without_90 != list_elf("fused_adam")
    ops = recorded_ops(wheel_ops, fused_adam=without_90)
    info = wheel_ops.parse_version_info(version_info())
    found = wheel_ops.problems(ops, info, CUDA_OPS, wheel_ops.arch_list(ARCHS), "cuda")
    assert found == ["fused_adam lacks sm_90 (9.0)"]


def test_an_op_not_built_and_a_cpu_build_are_named(wheel_ops):
    """async_io, which the recorded (controller) build left out, and the CPU accelerator a
    build without DS_ACCELERATOR=cuda takes."""
    ops = recorded_ops(wheel_ops)
    info = wheel_ops.parse_version_info(version_info().replace("'cuda'", "'cpu'"))
    found = wheel_ops.problems(ops, info, [*CUDA_OPS, "async_io"], ["sm_80"], "cuda")
    assert found == [
        "accelerator_name is 'cpu', not 'cuda'",
        "async_io not built (no deepspeed/ops/**/async_io_op*.so)",
    ]


def make_wheel(path: pathlib.Path, ops: list[str]) -> pathlib.Path:
    dirs = {"cpu_adam": "adam", "fused_adam": "adam", "fused_lamb": "lamb"}
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("deepspeed/git_version_info_installed.py", version_info())
        for op in ops:
            wheel.writestr(f"deepspeed/ops/{dirs[op]}/{op}_op.cpython-311-x86_64-linux-gnu.so", op)
    return path


def fake_cuobjdump(tmp_path: pathlib.Path) -> str:
    """A cuobjdump that answers with the recorded output of the op whose library it is given
    (each fake library holds its op's name), exiting 255 as the real one does for host code."""
    tool = tmp_path / "cuobjdump"
    tool.write_text(
        "#!/bin/sh\n"
        f'out={FIXTURES}/cuobjdump_list_elf_$(cat "$2").txt\n'
        'if grep -q "does not contain device code" "$out"; then cat "$out" >&2; exit 255; fi\n'
        'cat "$out"\n'
    )
    tool.chmod(0o755)
    return str(tool)


def test_main_reads_a_wheel(wheel_ops, tmp_path, capsys):
    wheel = make_wheel(tmp_path / "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl", CUDA_OPS)
    report = tmp_path / "report.json"
    args = [str(wheel), "--cuobjdump", fake_cuobjdump(tmp_path), "--want-arch", ARCHS]
    rc = wheel_ops.main([*args, "--want-ops", ",".join(CUDA_OPS), "--json", str(report)])
    assert (rc, capsys.readouterr().out.splitlines()) == (
        0,
        ["cpu_adam: host code only", "fused_adam: sm_80 sm_90", "fused_lamb: sm_80 sm_90"],
    )
    data = json.loads(report.read_text())
    assert data["ops"]["fused_lamb"] == {"archs": ["sm_80", "sm_90"], "host_only": False}
    assert data["missing"] == []
    # Asked for an op the wheel lacks: exit 1 and one line naming it.
    assert wheel_ops.main([*args, "--want-ops", "fused_adam,async_io"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "async_io not built" in err[0]


def test_main_on_no_wheel(wheel_ops, tmp_path, capsys):
    (tmp_path / "x.whl").write_text("not a zip")
    assert wheel_ops.main([str(tmp_path / "x.whl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_node_container_build_has_the_roles_cuda_ops(wheel_ops):
    """make cuda-wheel's recorded check (fixtures/cuda_build/wheel_ops_report.txt): every op
    the role pre-builds for cuda is there, each CUDA op with a cubin of every architecture of
    ml_stack_cuda_arch_list (the line format is format_op's)."""
    defaults = yaml.safe_load((rolefiles.ROLES / "ml_stack/defaults/main.yml").read_text())
    lines = (FIXTURES / "wheel_ops_report.txt").read_text().splitlines()
    ops = {}
    for line in lines:
        name, archs = line.split(": ")
        ops[name] = [] if archs == "host code only" else archs.split()
        assert wheel_ops.format_op(name, ops[name]) == line
    info = {"accelerator_name": "cuda", "installed_ops": dict.fromkeys(ops, 1)}
    want = list(defaults["ml_stack_deepspeed_prebuilt_ops"]["cuda"])
    archs = wheel_ops.arch_list(defaults["ml_stack_cuda_arch_list"])
    assert wheel_ops.problems(ops, info, want, archs, "cuda") == []
    assert ops["fused_adam"] == archs
