"""The options that belong to one launch mode (--accelerate-config, --accelerate-config-kind,
--gaudi-spawn): refused early when given to another mode or unusable, and turned into
LaunchRequest's fields and the local files to stage with the job. Reads the local files only.
"""

from __future__ import annotations

import pathlib

from ..errors import DsclusterError
from ..validate import read_text
from . import accelerate

# Where a local gaudi_spawn.py is staged in the job directory.
GAUDI_SPAWN_NAME = "gaudi_spawn.py"


def _only_for(launcher: str, mode: str, flag: str, given: object) -> None:
    if given is not None and launcher != mode:
        raise DsclusterError(
            f"{flag} is for --launcher {mode}, not --launcher {launcher}; drop it or pass "
            f"--launcher {mode}"
        )


def read_accelerate_config(path: pathlib.Path) -> tuple[str, str]:
    """(text, name staged in the job) of a user's accelerate config, checked."""
    text = read_text(path, "--accelerate-config")
    name = accelerate.config_name(str(path))
    accelerate.parse_config(text, str(path))
    return text, name


def check_gaudi_spawn(path: str) -> None:
    if pathlib.Path(path).expanduser().is_file():
        return
    if not path.startswith("/"):
        raise DsclusterError(
            f"--gaudi-spawn {path}: no such file here; give a local gaudi_spawn.py to stage "
            "(optimum-habana's examples/gaudi_spawn.py) or its absolute path on the nodes"
        )


def check_options(
    launcher: str,
    *,
    accelerate_config: pathlib.Path | None = None,
    accelerate_config_kind: str | None = None,
    gaudi_spawn: str | None = None,
) -> None:
    """Everything about the mode options that the command line alone shows."""
    _only_for(launcher, "accelerate", "--accelerate-config", accelerate_config)
    _only_for(launcher, "accelerate", "--accelerate-config-kind", accelerate_config_kind)
    _only_for(launcher, "gaudi_spawn", "--gaudi-spawn", gaudi_spawn)
    if accelerate_config is not None and accelerate_config_kind is not None:
        raise DsclusterError(
            f"--accelerate-config-kind {accelerate_config_kind} generates a config, and "
            f"--accelerate-config {accelerate_config} is your own; pass one of them"
        )
    if accelerate_config is not None:
        read_accelerate_config(accelerate_config)
    if launcher == "gaudi_spawn":
        if not gaudi_spawn:
            raise DsclusterError(
                "--launcher gaudi_spawn needs --gaudi-spawn PATH: optimum-habana's "
                "examples/gaudi_spawn.py (a local file to stage, or its absolute path on the "
                "nodes; pip's optimum-habana does not install it)"
            )
        check_gaudi_spawn(gaudi_spawn)


def plan_options(
    launcher: str,
    *,
    accelerate_config: pathlib.Path | None = None,
    accelerate_config_kind: str | None = None,
    gaudi_spawn: str | None = None,
) -> tuple[dict[str, str], dict[str, pathlib.Path]]:
    """LaunchRequest's fields for the mode options, and the local files to stage (name ->
    path): a local gaudi_spawn.py goes into the job directory as gaudi_spawn.py."""
    check_options(
        launcher,
        accelerate_config=accelerate_config,
        accelerate_config_kind=accelerate_config_kind,
        gaudi_spawn=gaudi_spawn,
    )
    kwargs: dict[str, str] = {}
    stage: dict[str, pathlib.Path] = {}
    if launcher == "accelerate":
        kwargs["accelerate_config_kind"] = accelerate_config_kind or "ddp"
        if accelerate_config is not None:
            text, name = read_accelerate_config(accelerate_config)
            kwargs["accelerate_config"] = text
            kwargs["accelerate_config_name"] = name
    if launcher == "gaudi_spawn" and gaudi_spawn:
        local = pathlib.Path(gaudi_spawn).expanduser()
        if local.is_file():
            kwargs["gaudi_spawn"] = GAUDI_SPAWN_NAME
            stage[GAUDI_SPAWN_NAME] = local
        else:
            kwargs["gaudi_spawn"] = gaudi_spawn
    return kwargs, stage
