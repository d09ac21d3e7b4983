"""Paths root reaches without following anything another user can change.

Every directory is opened from `/` one component at a time with O_NOFOLLOW, each relative to
the one before (openat), and each is checked before the next is opened: a symbolic link, a
directory owned by an untrusted user or one that others may write to is refused with one line
naming it. Files are then read, written (a temporary file renamed over the name) and chowned
through descriptors, never by a name that could be swapped between a check and its use.
Shared by the collection's modules (cluster_ssh_files, cluster_dirs).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# O_NONBLOCK: a FIFO planted where a file is expected must not block the reader.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafePath(Exception):
    """A path root will not use; the message is one line naming it and the fix."""


def account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def uid_of(owner: str | int | None) -> int:
    if owner is None:
        return os.geteuid()
    if isinstance(owner, int) or str(owner).isdigit():
        return int(owner)
    return pwd.getpwnam(str(owner)).pw_uid


def gid_of(group: str | int | None, uid: int) -> int:
    if group is None or group == "":
        return pwd.getpwuid(uid).pw_gid if uid != os.geteuid() else os.getegid()
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    return grp.getgrnam(str(group)).gr_gid


def mode_of(mode: str | int | None, default: int) -> int:
    if mode is None or mode == "":
        return default
    if isinstance(mode, int):
        return mode
    return int(str(mode), 8)


def _opened(parent: int, name: str, path: str, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        link = exc.errno == errno.ELOOP
        if exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            # Linux answers ENOTDIR, not ELOOP, for a link opened with O_DIRECTORY: say which
            with contextlib.suppress(OSError):
                link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        if link:
            raise UnsafePath(
                f"{path} is a symbolic link; root does not follow links there: remove it "
                "(or replace it with a real directory or file) and run again"
            ) from None
        if exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            raise UnsafePath(f"{path} is not a directory: move it away and run again") from None
        raise


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return -1


def others_write(st: os.stat_result) -> bool:
    """Someone but the owner may write it. Group write is the owner's alone where the group is
    root's or the owner's own (a user private group, as useradd makes)."""
    group_others = st.st_mode & 0o020 and st.st_gid not in (0, _primary_gid(st.st_uid))
    return bool(st.st_mode & 0o002 or group_others)


def check_dir(fd: int, path: str, trusted: frozenset[int]) -> None:
    """Refuse a directory owned outside `trusted`, or one that others may rename entries in."""
    st = os.fstat(fd)
    if st.st_uid not in trusted:
        raise UnsafePath(
            f"{path} belongs to {account(st.st_uid)}; root writes below it only where it "
            f"belongs to {' or '.join(sorted(account(u) for u in trusted))}: chown it or "
            "choose another path"
        )
    if others_write(st) and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(
            f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); root writes "
            "below it only where no one else can rename what is in it: chmod go-w it (or +t)"
        )


def walk(
    path: str,
    trusted: frozenset[int] = frozenset({0}),
    *,
    make_mode: int | None = None,
    check_mode: bool = False,
) -> tuple[int | None, list[str]]:
    """The directory `path` opened from `/` without following links, it and each of its
    parents checked (check_dir) against `trusted`.

    Missing components are made root's at `make_mode` (None: refused). Returns the open
    descriptor (None in check mode where a component would be made: nothing below it exists)
    and the directories made (or that would be)."""
    if not path.startswith("/"):
        raise UnsafePath(f"{path} is not an absolute path")
    fd = os.open("/", DIR_FLAGS)
    made: list[str] = []
    here = ""
    try:
        for name in [p for p in path.split("/") if p]:
            if name in (".", ".."):
                raise UnsafePath(f"{path} has a '{name}' component: give the path plainly")
            check_dir(fd, here or "/", trusted)
            here = f"{here}/{name}"
            try:
                nxt = _opened(fd, name, here, DIR_FLAGS)
            except FileNotFoundError:
                if make_mode is None:
                    raise UnsafePath(f"{here} does not exist") from None
                made.append(here)
                if check_mode:
                    os.close(fd)
                    return None, made + _rest(path, here)
                try:
                    os.mkdir(name, make_mode, dir_fd=fd)
                    ours = True
                except FileExistsError:
                    ours = False  # made by someone else meanwhile: checked as any other
                nxt = _opened(fd, name, here, DIR_FLAGS)
                if ours:
                    if os.geteuid() == 0:
                        os.fchown(nxt, 0, 0)
                    os.fchmod(nxt, make_mode)
            os.close(fd)
            fd = nxt
        check_dir(fd, here or "/", trusted)
        return fd, made
    except BaseException:
        os.close(fd)
        raise


def _rest(path: str, here: str) -> list[str]:
    rest, out = path[len(here) :].strip("/"), []
    for name in [p for p in rest.split("/") if p]:
        here = f"{here}/{name}"
        out.append(here)
    return out


def attrs(fd: int, uid: int, gid: int, mode: int, check_mode: bool) -> bool:
    """Owner, group and mode through the descriptor; True where one differed."""
    st = os.fstat(fd)
    changed = False
    if (st.st_uid, st.st_gid) != (uid, gid):
        changed = True
        if not check_mode:
            os.fchown(fd, uid, gid)
    if stat.S_IMODE(st.st_mode) != mode:
        changed = True
        if not check_mode:
            os.fchmod(fd, mode)
    return changed


def open_file(dir_fd: int, name: str, path: str, owners: frozenset[int]) -> int | None:
    """A regular file in the directory, opened without following a link; None where absent.

    Refused: a link, anything but a regular file, a file with other hard links (it could be
    another file's), or one owned outside `owners`."""
    try:
        fd = _opened(dir_fd, name, path, FILE_FLAGS)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_nlink > 1:
        problem = f"has {st.st_nlink} hard links (it may be another file's)"
    elif st.st_uid not in owners:
        problem = f"belongs to {account(st.st_uid)}"
    if problem:
        os.close(fd)
        raise UnsafePath(
            f"{path} {problem}; root does not read or write through it: remove it and run again"
        )
    return fd


def write_file(dir_fd: int, name: str, data: bytes, uid: int, gid: int, mode: int) -> None:
    """The whole file, atomically: a new file made beside it at its owner and mode before any
    byte is written, then renamed over the name (a link there is replaced, never followed)."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def ensure_dir(
    parent: int, name: str, path: str, uid: int, gid: int, mode: int, check_mode: bool
) -> tuple[int | None, bool, bool]:
    """A directory in `parent` as asked (made where missing), opened without following links;
    owned by the user asked for or root beforehand, else refused. (fd, or None in check mode
    where it would be made; made; changed)."""
    try:
        fd = _opened(parent, name, path, DIR_FLAGS)
    except FileNotFoundError:
        if check_mode:
            return None, True, True
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
        fd = _opened(parent, name, path, DIR_FLAGS)
        made = True
    else:
        made = False
    try:
        st = os.fstat(fd)
        if st.st_uid not in (0, uid):
            raise UnsafePath(
                f"{path} belongs to {account(st.st_uid)}, not {account(uid)}; root does not take "
                "over another user's directory: remove it or choose another path"
            )
        changed = attrs(fd, uid, gid, mode, check_mode) or made
    except BaseException:
        os.close(fd)
        raise
    return fd, made, changed


# ---- root_chain: a path root runs from or writes through -----------------------------------

LINK_HOPS = 16  # links followed on the way; more is refused (the kernel's ELOOP says 40)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _chain_refusal(path: str, here: str, st: os.stat_result, via: list[str]) -> str:
    """Why root may not trust `here`, met on the way to `path`, or ''."""
    if st.st_uid != 0:
        problem = f"{here} belongs to {account(st.st_uid)}"
    elif others_write(st) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        problem = (
            f"{here} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, group "
            f"{_group(st.st_gid)})"
        )
    else:
        return ""
    route = f" (through {', '.join(via)})" if via else ""
    return (
        f"{path}{route}: {problem}; root runs nothing from, and writes nothing through, a path "
        f"another user could change: make {here} root's (chown root:root, chmod go-w) or set "
        "the variable that names this path to one below root's own directories (/opt/dscluster)"
    )


def root_chain(path: str) -> None:
    """Refuse `path` (UnsafePath: one line naming it, the component at fault, its owner and the
    fix) unless root alone can change it and every directory above it, up to /.

    From / one component at a time, each looked up without following links (lstat) and only
    after the directory it is in was checked: a component that is not root's, or that others
    may write (a sticky directory such as /tmp excepted, as check_dir decides), is refused.
    Names are safe to use here because every directory already passed is one only root can
    change: nothing below it can be swapped once checked (and if root changes it, root meant
    to). The last component may be a directory or a file. A link is followed, its target
    checked the same way from where it points: a link in a directory only root can change was
    made by root (a venv's bin/python -> /usr/bin/python3, merged-usr's /bin -> usr/bin), and
    where it leads must be root's too. A missing tail is accepted: root makes it later (the
    module that makes a directory, cluster_dirs' walk, checks each one as it makes it); only
    what exists is checked."""
    if not path.startswith("/"):
        raise UnsafePath(f"{path} is not an absolute path")
    todo = [p for p in path.split("/") if p]
    if any(name in (".", "..") for name in todo):
        raise UnsafePath(f"{path} has a '.' or '..' component: give the path plainly")
    todo.reverse()
    here, st = "/", os.lstat("/")
    via: list[str] = []  # the links followed, for the message
    while True:
        if problem := _chain_refusal(path, here, st, via):
            raise UnsafePath(problem)
        if not todo:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{path}: {here} is not a directory")
        name = todo.pop()
        if name in ("", "."):
            continue
        nxt = os.path.dirname(here) if name == ".." else os.path.join(here, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return
        if not stat.S_ISLNK(st.st_mode):
            here = nxt
            continue
        if len(via) >= LINK_HOPS:
            raise UnsafePath(f"{path}: more than {LINK_HOPS} links on the way, at {nxt}")
        target = os.readlink(nxt)
        via.append(f"{nxt} -> {target}")
        if target.startswith("/"):
            here = "/"
        st = os.lstat(here)  # the link's directory (or /): where its target is looked up
        todo.extend(reversed(target.split("/")))
