"""What a user sees when something goes wrong: one line for their mistakes, one line naming
a saved bug report for ours (DSCLUSTER_DEBUG=1 shows the traceback), and output files that
are written as a whole set or not at all."""

from __future__ import annotations

import os
import pathlib

import pytest

from dscluster import cli, util
from dscluster.errors import DsclusterError
from dscluster.text import one_line


def _boom(args, out, err):
    raise KeyError("unexpected")


def _patched_hostfile(monkeypatch, func) -> None:
    parser = cli.build_parser

    def build():
        p = parser()
        sub = next(a for a in p._actions if a.dest == "command")
        sub.choices["hostfile"].set_defaults(func=func)
        return p

    monkeypatch.setattr(cli, "build_parser", build)


def test_a_bug_is_one_line_naming_its_report(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DSCLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DSCLUSTER_DEBUG", raising=False)
    _patched_hostfile(monkeypatch, _boom)
    assert cli.main(["hostfile", "-i", "x"]) == 3
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dscluster: internal error (a bug in dscluster")
    reports = list((tmp_path / "cache" / "bug-reports").iterdir())
    assert len(reports) == 1 and str(reports[0]) in lines[0]
    text = reports[0].read_text()
    assert "Traceback" in text and "KeyError: 'unexpected'" in text and "'hostfile'" in text
    # the job's argv is in it: readable by this user only
    assert reports[0].stat().st_mode & 0o777 == 0o600
    assert reports[0].parent.stat().st_mode & 0o777 == 0o700


def test_a_bug_report_is_private_even_where_an_older_one_was_not(monkeypatch, tmp_path):
    """A reports directory an older dscluster made 0755 becomes 0700; a link planted at the
    report's name is not written through (no report then, and the target is untouched)."""
    monkeypatch.setenv("DSCLUSTER_CACHE", str(tmp_path / "cache"))
    reports = tmp_path / "cache" / "bug-reports"
    reports.mkdir(parents=True, mode=0o755)
    os.chmod(reports, 0o755)
    written = cli.bug_report(KeyError("x"), ["dscluster", "launch", "--token", "s3cret"])
    assert written is not None and written.parent == reports
    assert reports.stat().st_mode & 0o777 == 0o700
    assert written.stat().st_mode & 0o777 == 0o600 and "s3cret" in written.read_text()
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    written.unlink()
    written.symlink_to(victim)
    monkeypatch.setattr(cli.dt, "datetime", _Frozen(written.name))
    assert cli.bug_report(KeyError("y"), ["dscluster"]) is None
    assert victim.read_text() == "mine\n"


class _Frozen:
    """datetime stand-in whose now() gives the stamp of an earlier report's name."""

    def __init__(self, name: str) -> None:
        self.stamp = name.split("-", maxsplit=1)[0]

    def now(self, tz):
        stamp = self.stamp

        class _Now:
            def strftime(self, fmt):
                return stamp

        return _Now()


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("DSCLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DSCLUSTER_DEBUG", "1")
    _patched_hostfile(monkeypatch, _boom)
    with pytest.raises(KeyError):
        cli.main(["hostfile", "-i", "x"])
    assert not (tmp_path / "cache" / "bug-reports").exists()


def test_a_user_error_is_one_plain_line(monkeypatch, capsys):
    def fail(args, out, err):
        raise DsclusterError("value [bold]x[/bold] \x1b[31mred\x1b[0m\nsecond line")

    _patched_hostfile(monkeypatch, fail)
    assert cli.main(["hostfile", "-i", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "dscluster: error: value [bold]x[/bold] red second line\n"


def test_argument_errors_are_one_line_without_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["smoke", "-i", "inv", "--steps", "many"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err
    assert err.startswith("dscluster: error: --steps many is not a whole number")


def test_one_line_folds_and_strips():
    assert one_line("a\n  b\r\n\x1b[1mc\x1b[0m\x07") == "a b c"


# ---- util.write_files: a set of files, all or nothing -----------------------------------


def _tree(root: pathlib.Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def test_write_files_replaces_every_file(tmp_path):
    (tmp_path / "a").write_text("old a")
    util.write_files({tmp_path / "a": "new a", tmp_path / "d" / "e" / "b": b"bytes"})
    assert (tmp_path / "a").read_text() == "new a"
    assert (tmp_path / "d" / "e" / "b").read_bytes() == b"bytes"
    assert sorted(os.listdir(tmp_path)) == ["a", "d"]  # nothing staged is left


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_write_files_failing_rename_leaves_everything_as_it_was(tmp_path, monkeypatch, fail_at):
    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").write_text("old b")
    before = _tree(tmp_path)
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        if str(src).endswith(".new"):
            calls.append(dst)
            if len(calls) > fail_at:
                raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    files = {tmp_path / "a": "new a", tmp_path / "new" / "c": "c", tmp_path / "b": "new b"}
    with pytest.raises(DsclusterError, match="No space left on device; choose a writable place"):
        util.write_files(files)
    assert _tree(tmp_path) == before


def test_write_files_backup_never_uses_a_name_someone_else_made(tmp_path, monkeypatch):
    """The old file's backup goes under a fresh name: a file or link another user put at the
    first name tried is left alone (no mktemp race), and a failure still restores the old
    file byte for byte; without hard links the backup is a private copy."""
    target = tmp_path / "hosts.yml"
    target.write_text("old\n")
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    names = iter(["aaaa", "bbbb", "cccc", "dddd"])
    monkeypatch.setattr(util.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".hosts.yml.aaaa.old").symlink_to(victim)  # planted first
    real_replace = os.replace
    seen: list[str] = []

    def replace(src, dst):
        if str(src).endswith(".new"):
            seen.extend(p.name for p in tmp_path.iterdir() if p.name.endswith(".old"))
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(DsclusterError, match="No space left"):
        util.write_files({target: "new\n"})
    assert sorted(seen) == [".hosts.yml.aaaa.old", ".hosts.yml.bbbb.old"]  # skipped, not reused
    assert target.read_text() == "old\n" and victim.read_text() == "not yours\n"
    assert (tmp_path / ".hosts.yml.aaaa.old").is_symlink()
    monkeypatch.setattr(os, "replace", real_replace)

    def no_links(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    util.write_files({target: "new\n"})
    assert target.read_text() == "new\n" and victim.read_text() == "not yours\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".old") and not p.is_symlink()]
    assert "mktemp(" not in pathlib.Path(util.__file__).read_text()


def test_write_files_refuses_a_directory_target_before_writing(tmp_path):
    (tmp_path / "a").write_text("old a")
    (tmp_path / "dir").mkdir()
    before = _tree(tmp_path)
    with pytest.raises(DsclusterError, match="dir: it is a directory; give a file path"):
        util.write_files({tmp_path / "a": "new", tmp_path / "dir": "x"})
    with pytest.raises(DsclusterError, match="a is a file, not a directory"):
        util.write_files({tmp_path / "z": "new", tmp_path / "a" / "x": "x"})
    assert _tree(tmp_path) == before
