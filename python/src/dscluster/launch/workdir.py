"""`dscluster launch --workdir DIR`: the project directory shipped with a job.

The project is every file under DIR but `.git/` and what DIR's `.gitignore` files (nested ones
too, git's own rules through pathspec's GitIgnoreSpec) leave out. It travels as one tarball,
unpacked into the job directory, where the program runs; `project_for` refuses what could not
work there before anything is written: a symlink leading out of DIR, a project over
MAX_PROJECT_BYTES, a script outside the project, a name dscluster's job files use.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import stat
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence

import pathspec

from ..errors import DsclusterError

MAX_PROJECT_BYTES = 512 * 1024 * 1024
# The job directory's own files, beside the project: every launcher's (render.build_plan's
# Plan.files) and launch.yml's. A launcher that stages a new file adds its name here.
JOB_FILE_NAMES = frozenset(
    {
        "launch.sh",
        "hostfile",
        ".deepspeed_env",
        "mpi_hostfile",
        "mpi_rank.sh",
        "launch_watch.py",
        "torchrun_node.sh",
        "ds_rank.sh",
        "accelerate_node.sh",
        "accelerate_config.yaml",
        "accelerate_config.json",
        "gaudi_hostfile",
        "gaudi_spawn.py",
        "launcher.log",
        "exit_status",
    }
)
# The tarball a job is staged as (its files, and the project of --workdir), in the controller's
# staging directory; launch.yml unpacks it on the nodes in one step.
JOB_TAR = ".dscluster-job.tar"


@dataclasses.dataclass(frozen=True)
class Project:
    """The files of DIR to ship: relative posix path -> (absolute path, size, symlink target
    relative to the link's directory, or "" for a regular file)."""

    root: pathlib.Path
    entries: dict[str, tuple[pathlib.Path, int, str]]

    @property
    def size(self) -> int:
        return sum(size for _, size, _ in self.entries.values())

    def describe(self) -> str:
        return f"{len(self.entries)} files from {self.root}"


def _spec_for(directory: pathlib.Path) -> pathspec.GitIgnoreSpec | None:
    path = directory / ".gitignore"
    if not path.is_file():
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())
    except (OSError, ValueError) as exc:
        raise DsclusterError(
            f"{path}: cannot read it as a .gitignore ({exc}); fix or remove it"
        ) from exc


def _ignored(rel: str, is_dir: bool, specs: Sequence[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
    """Git's verdict: the deepest .gitignore with a matching pattern decides."""
    verdict = False
    for base, spec in specs:
        sub = rel[len(base) + 1 :] if base else rel
        result = spec.check_file(sub + "/" if is_dir else sub)
        if result.include is not None:
            verdict = result.include
    return verdict


def _walk(root: pathlib.Path) -> Iterable[tuple[str, pathlib.Path]]:
    """(relative path, path) of every file and symlink git would not ignore."""
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    stack: list[tuple[str, pathlib.Path]] = [("", root)]
    while stack:
        base, directory = stack.pop()
        # a subdirectory's patterns apply below it only
        active = [(b, s) for b, s in specs if not b or base == b or base.startswith(b + "/")]
        spec = _spec_for(directory)
        if spec is not None:
            active.append((base, spec))
        specs = active
        children = []
        for child in sorted(directory.iterdir(), key=lambda p: p.name):
            rel = f"{base}/{child.name}" if base else child.name
            is_dir = child.is_dir() and not child.is_symlink()
            if child.name == ".git" or _ignored(rel, is_dir, specs):
                continue
            if is_dir:
                children.append((rel, child))
            else:
                yield rel, child
        stack.extend(reversed(children))


def scan(workdir: str) -> Project:
    """The project under `workdir`; refuses symlinks out of it and an oversized project."""
    root = pathlib.Path(workdir).expanduser()
    if not root.is_dir():
        raise DsclusterError(
            f"--workdir {workdir}: not a directory here; give your project's directory, "
            "e.g. --workdir ."
        )
    root = root.resolve()
    entries: dict[str, tuple[pathlib.Path, int, str]] = {}
    for rel, path in _walk(root):
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root) or not target.exists():
                raise DsclusterError(
                    f"--workdir {workdir}: {rel} links to {os.readlink(path)}, outside the "
                    "project; copy the file in or list the link in .gitignore"
                )
            link = os.path.relpath(target, path.parent.resolve())
            entries[rel] = (path, 0, pathlib.PurePath(link).as_posix())
        elif path.is_file():
            entries[rel] = (path, path.stat().st_size, "")
    project = Project(root, entries)
    if project.size > MAX_PROJECT_BYTES:
        big = sorted(entries.items(), key=lambda e: -e[1][1])[:3]
        names = ", ".join(f"{rel} ({size // 2**20} MiB)" for rel, (_, size, _) in big)
        raise DsclusterError(
            f"--workdir {workdir}: {project.size // 2**20} MiB of files, over the "
            f"{MAX_PROJECT_BYTES // 2**20} MiB a job ships (biggest: {names}); list data and "
            "checkpoints in the project's .gitignore and read them from shared storage"
        )
    return project


def check_names(project: Project, job_files: Iterable[str] = JOB_FILE_NAMES) -> None:
    """Refuse a project whose top-level names are the job directory's own files."""
    taken = set(job_files) | {JOB_TAR}
    clash = sorted({rel.split("/")[0] for rel in project.entries} & taken)
    if clash:
        raise DsclusterError(
            f"--workdir {project.root}: {', '.join(clash)} is a name dscluster's job files use "
            "in the job directory; rename it or list it in the project's .gitignore"
        )


def script_in(project: Project, workdir: str, script: str) -> str:
    """The script's path relative to the project root (how the job runs it)."""
    path = pathlib.Path(script).expanduser()
    if path.is_absolute():
        resolved = path.resolve()
        rel = (
            resolved.relative_to(project.root).as_posix()
            if resolved.is_relative_to(project.root)
            else ""
        )
    else:
        rel = pathlib.PurePath(os.path.normpath(script)).as_posix()
    if rel not in project.entries:
        raise DsclusterError(
            f"script {script} is not a file of the project in --workdir {workdir}; give its "
            "path relative to the directory (e.g. train.py), and not one .gitignore leaves out"
        )
    return rel


def project_for(workdir: str, script: str) -> tuple[Project, str]:
    """Everything --workdir refuses, before anything runs: the project and the script."""
    project = scan(workdir)
    check_names(project)
    return project, script_in(project, workdir, script)


def _mode(path: pathlib.Path) -> int:
    return 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644


def write_tar(project: Project, dest: pathlib.Path) -> None:
    """One tarball, the same bytes for the same files: sorted, owner-less, modes 0644/0755."""
    with (
        dest.open("wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _add_project(tar, project, "")


def write_job_tar(
    dest: pathlib.Path,
    top: str,
    files: Mapping[str, tuple[bytes, int]],
    project: Project | None = None,
) -> None:
    """The job as one tarball under the directory `top` (the job directory's name): the
    project's entries (as write_tar has them), then the job's own files (name -> (bytes,
    mode)); owner-less, the directory 0700: the job area is the training user's alone."""
    with (
        dest.open("wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_info(top, tarfile.DIRTYPE, 0o700, 0))
        if project is not None:
            _add_project(tar, project, f"{top}/")
        now = int(time.time())
        for name in sorted(files):
            data, mode = files[name]
            info = _info(f"{top}/{name}", tarfile.REGTYPE, mode, now)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _add_project(tar: tarfile.TarFile, project: Project, prefix: str) -> None:
    dirs: set[str] = set()
    for rel in sorted(project.entries):
        path, _, link = project.entries[rel]
        parts = rel.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                tar.addfile(_info(prefix + d, tarfile.DIRTYPE, 0o755, 0))
        if link:
            info = _info(prefix + rel, tarfile.SYMTYPE, 0o777, 0)
            info.linkname = link
            tar.addfile(info)
            continue
        info = _info(prefix + rel, tarfile.REGTYPE, _mode(path), int(path.stat().st_mtime))
        with path.open("rb") as f:
            info.size = os.fstat(f.fileno()).st_size
            tar.addfile(info, f)


def _info(name: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
