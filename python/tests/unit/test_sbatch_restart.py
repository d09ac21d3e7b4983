"""`dscluster sbatch --max-restarts N`: the requeue form of launch's restarts. The rendered
script's restart block is run for real under bash against a fake Slurm environment and a
checkpoint directory; without the flags the script is byte for byte what it was before them
(fixtures/sbatch, rendered before --max-restarts existed)."""

from __future__ import annotations

import pathlib

import pytest

from dscluster import sbatch

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "sbatch"


def golden_options(mode: str, **extra) -> sbatch.SbatchOptions:
    """The options fixtures/sbatch/<mode>.sbatch was rendered from."""
    return sbatch.SbatchOptions(
        launcher=mode,
        command=["train.py", "--steps", "40"],
        nodes=3,
        slots=2,
        partition="debug",
        time="1:00:00",
        job_name="resume",
        chdir="/shared/jobs/r1",
        env={"FROM_INVENTORY": "yes"},
        origin=f"dscluster sbatch --launcher {mode}",
        **extra,
    )


@pytest.mark.parametrize("mode", sbatch.MODES)
def test_without_restarts_the_script_is_unchanged(mode):
    assert sbatch.render_sbatch(golden_options(mode)) == (FIXTURES / f"{mode}.sbatch").read_text()
