"""A bytecode cache for Ansible's module payloads on this node (installed by dscluster's base role).

Every Ansible task that runs a Python module ships it as a zip (AnsiballZ): the module and
the module_utils it imports, `ansible.module_utils.basic` among them. Python's zipimport
compiles each imported source afresh on every run, since nothing can write bytecode into
that throw-away zip: about 0.2 CPU-seconds of a module run's 0.4 on a small node, a
hundred times or more in a provision. This hook, imported from a .pth file in the node
interpreter's site-packages, keeps each compiled source in a cache directory keyed by the
source's SHA-256 (and the interpreter's bytecode magic), and reuses it in later runs:
the same source always compiles to the same code, so a hit is exact, and a changed module
(another ansible-core) is a new key. Only zips named as Ansible names its payloads
(`ansible_<module>_payload.zip`) go through it; any other import is untouched.

Trust: entries are read only from a directory owned by root (or by the running user) that
no one else may write to, and only entries of that owner; they are written only by that
owner (root, for `become` tasks), atomically. Anything unexpected (no directory, a
directory others may write to, an unreadable or corrupt entry, an older Python without
zipimport._compile_source) falls back to compiling as Python would: the hook can make a
module run faster, never different. DSCLUSTER_ANSIBALLZ_CACHE names another directory.
"""

import os
import zipimport

CACHE_DIR = os.environ.get("DSCLUSTER_ANSIBALLZ_CACHE", "/var/cache/dscluster/ansiballz")
# Entries a directory may hold before the hook stops adding to it (each ansible-core
# release adds about a hundred): a bound, not a policy; provision with another
# ansible-core and remove the directory to start over.
MAX_ENTRIES = 4000
_compile = getattr(zipimport, "_compile_source", None)


def _payload(pathname):
    """Is pathname a source inside an Ansible module payload (…/ansible_<m>_payload.zip/…)?"""
    archive = pathname.split(".zip" + os.sep, 1)[0]
    return (
        archive != pathname
        and os.path.basename(archive).startswith("ansible_")
        and (archive.endswith("_payload"))
    )


def _trusted(st, uid):
    """A directory or file owned by root or by us, that no one else may write to."""
    return st.st_uid in (0, uid) and not st.st_mode & 0o022


def _renamed(code, name):
    """The code object and every one nested in it, with co_filename set to name."""
    import types  # noqa: PLC0415 - imported by every python3 start: only when used

    consts = tuple(
        _renamed(c, name) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=name, co_consts=consts)


def _cached(pathname, source):
    import hashlib  # noqa: PLC0415 - likewise
    import importlib.util  # noqa: PLC0415
    import marshal  # noqa: PLC0415

    uid = os.geteuid()
    magic = importlib.util.MAGIC_NUMBER
    dir_st = os.stat(CACHE_DIR)
    if not _trusted(dir_st, uid):
        return None
    entry = os.path.join(CACHE_DIR, hashlib.sha256(magic + source).hexdigest())
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None
    if fd is not None:
        with os.fdopen(fd, "rb") as fh:
            if _trusted(os.fstat(fh.fileno()), uid):
                data = fh.read()
                if data[: len(magic)] == magic:
                    return _renamed(marshal.loads(data[len(magic) :]), pathname)
    # A miss: compile under a fixed name (the payload's path differs every run), keep it
    # where only its owner may write it, hand back the code under the real name.
    code = _compile("<ansiballz>", source)
    if dir_st.st_uid == uid and len(os.listdir(CACHE_DIR)) < MAX_ENTRIES:
        tmp = f"{entry}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(magic + marshal.dumps(code))
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
    return _renamed(code, pathname)


def _compile_source(pathname, source):
    if _payload(pathname):
        try:
            code = _cached(pathname, source)
        except Exception:  # any trouble: compile as Python would
            code = None
        if code is not None:
            return code
    return _compile(pathname, source)


if _compile is not None and os.path.isdir(CACHE_DIR):
    zipimport._compile_source = _compile_source
