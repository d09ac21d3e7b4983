"""base's shared .deb cache (roles/base/files/apt_deb_cache.py), run for real against an
apt-get stand-in that answers --print-uris from a package pool and "downloads" from it."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from .. import rolefiles

SCRIPT = rolefiles.path("base", "files/apt_deb_cache.py")

# apt-get's two uses by the script: --print-uris lists each pool file not already in the
# archives (name, size, MD5Sum, as apt-get prints them); --download-only copies those files in.
FAKE_APT_GET = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case " $* " in
  *" --print-uris "*)
    for f in "$FAKE_POOL"/*.deb; do
      n=$(basename "$f")
      [ -e "$FAKE_ARCHIVES/$n" ] && continue
      printf "'http://deb.example/pool/%s' %s %s MD5Sum:%s\\n" \\
        "$n" "$n" "$(stat -c %s "$f")" "$(md5sum "$f" | cut -d' ' -f1)"
    done ;;
  *" --download-only "*)
    [ -n "$FAKE_FAIL" ] && { echo "E: Failed to fetch http://deb.example/pool/x" >&2; exit 100; }
    for f in "$FAKE_POOL"/*.deb; do
      [ -e "$FAKE_ARCHIVES/$(basename "$f")" ] || cp "$f" "$FAKE_ARCHIVES/"
    done ;;
esac
"""
# apt-cache show NAME=VERSION...: each pool file's record, with its SHA256 (none for the
# package named in FAKE_NO_SHA).
FAKE_APT_CACHE = """#!/bin/sh
shift
for pin in "$@"; do
  name=${pin%%=*}; version=${pin#*=}
  [ "$name" = "$FAKE_NO_SHA" ] && continue
  for f in "$FAKE_POOL/${name}_${version}_"*.deb; do
    [ -e "$f" ] || continue
    printf "Package: %s\\nVersion: %s\\nFilename: pool/main/%s\\nSHA256: %s\\n\\n" \\
      "$name" "$version" "$(basename "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
  done
done
"""


class Node:
    """One node's apt archives, sharing `cache` and the package pool with the other nodes."""

    def __init__(self, root: pathlib.Path, pool: pathlib.Path, name: str) -> None:
        self.archives = root / name / "archives"
        self.archives.mkdir(parents=True)
        self.log = root / name / "apt-get.log"
        self.log.touch()
        bindir = root / "bin"
        if not bindir.exists():
            bindir.mkdir()
            for tool, text in (("apt-get", FAKE_APT_GET), ("apt-cache", FAKE_APT_CACHE)):
                (bindir / tool).write_text(text)
                (bindir / tool).chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{bindir}:{os.environ['PATH']}",
            "FAKE_POOL": str(pool),
            "FAKE_ARCHIVES": str(self.archives),
            "FAKE_LOG": str(self.log),
        }

    def run(self, cache: pathlib.Path, *args: str, fail: bool = False, no_sha: str = ""):
        env = {**self.env, "FAKE_NO_SHA": no_sha, **({"FAKE_FAIL": "1"} if fail else {})}
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(cache), "--archives", str(self.archives), *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        return proc

    def report(self, cache: pathlib.Path, *args: str, fail: bool = False, no_sha: str = "") -> dict:
        proc = self.run(cache, *args, fail=fail, no_sha=no_sha)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def downloads(self) -> int:
        return sum("--download-only" in line for line in self.log.read_text().splitlines())


@pytest.fixture
def pool(tmp_path: pathlib.Path) -> pathlib.Path:
    pool = tmp_path / "pool"
    pool.mkdir()
    for name in (
        "gcc-12_12.2.0-14_amd64.deb",
        "libaio1_0.3.113-4_amd64.deb",
        "rsync_3.2.7-1_amd64.deb",
    ):
        (pool / name).write_bytes(hashlib.sha256(name.encode()).digest() * 64)
    return pool


def test_the_second_node_takes_every_archive_from_the_cache(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = Node(tmp_path, pool, "n1"), Node(tmp_path, pool, "n2")

    got = first.report(cache, "--no-install-recommends", "build-essential", "rsync")
    assert got == {"needed": 3, "from_cache": 0, "downloaded": 3, "added": 3, "problem": ""}
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in pool.iterdir())
    assert all((cache / p.name).read_bytes() == p.read_bytes() for p in pool.iterdir())
    assert "--no-install-recommends" in first.log.read_text()

    got = second.report(cache, "build-essential", "rsync")
    assert got == {"needed": 3, "from_cache": 3, "downloaded": 0, "added": 0, "problem": ""}
    assert second.downloads() == 0  # apt-get was asked what to fetch, never to fetch it
    assert all((second.archives / p.name).read_bytes() == p.read_bytes() for p in pool.iterdir())
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_cached_file_that_does_not_match_the_index_is_replaced(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    bad = cache / "rsync_3.2.7-1_amd64.deb"
    bad.write_bytes(b"x" * (pool / bad.name).stat().st_size)  # same size, other content
    node = Node(tmp_path, pool, "n1")
    got = node.report(cache, "rsync")
    assert got["from_cache"] == 0 and got["downloaded"] == 3 and got["added"] == 3
    assert bad.read_bytes() == (pool / bad.name).read_bytes()
    assert (node.archives / bad.name).read_bytes() == (pool / bad.name).read_bytes()


def test_an_archive_without_a_sha256_in_the_lists_is_neither_taken_nor_added(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = Node(tmp_path, pool, "n1"), Node(tmp_path, pool, "n2")
    got = first.report(cache, "rsync", no_sha="rsync")
    assert (got["downloaded"], got["added"]) == (3, 2)
    assert not (cache / "rsync_3.2.7-1_amd64.deb").exists()
    (cache / "rsync_3.2.7-1_amd64.deb").write_bytes((pool / "rsync_3.2.7-1_amd64.deb").read_bytes())
    got = second.report(cache, "rsync", no_sha="rsync")  # its MD5Sum alone does not do
    assert (got["from_cache"], got["downloaded"], got["added"]) == (2, 1, 0)


def test_a_newer_version_replaces_the_cached_older_one(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    old = cache / "rsync_3.2.7-0_amd64.deb"
    other_arch = cache / "rsync_3.2.7-0_arm64.deb"
    other_pkg = cache / "rsync-extra_1.0_amd64.deb"
    for f in (old, other_arch, other_pkg):
        f.write_bytes(b"old")
    Node(tmp_path, pool, "n1").report(cache, "rsync")
    assert not old.exists()
    assert other_arch.exists() and other_pkg.exists()
    assert (cache / "rsync_3.2.7-1_amd64.deb").exists()


def test_a_copy_left_half_way_is_swept_after_an_hour(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    old = cache / ".rsync_3.2.7-1_amd64.deb.n9.4242"
    fresh = cache / ".gcc-12_12.2.0-14_amd64.deb.n8.4343"  # another node copying right now
    for f in (old, fresh):
        f.write_bytes(b"half")
    os.utime(old, (time.time() - 3700, time.time() - 3700))
    Node(tmp_path, pool, "n1").report(cache, "rsync")
    assert not old.exists() and fresh.exists()


def test_without_a_cache_directory_apt_downloads_as_usual(tmp_path, pool):
    node = Node(tmp_path, pool, "n1")
    got = node.report(tmp_path / "absent", "rsync")
    assert got["problem"] == f"no cache directory {tmp_path / 'absent'}"
    assert (got["from_cache"], got["downloaded"], got["added"]) == (0, 3, 0)
    assert not (tmp_path / "absent").exists()
    assert len(list(node.archives.iterdir())) == 3


def test_a_failed_download_is_reported_not_raised(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    got = Node(tmp_path, pool, "n1").report(cache, "rsync", fail=True)
    assert got["problem"].startswith("apt-get --download-only failed: E: Failed to fetch")
    assert (got["downloaded"], got["added"]) == (0, 0)
    assert list(cache.iterdir()) == []


def test_nothing_to_download_asks_apt_only_what_it_needs(tmp_path, pool):
    cache = tmp_path / "cache"
    cache.mkdir()
    node = Node(tmp_path, pool, "n1")
    for p in pool.iterdir():
        (node.archives / p.name).write_bytes(p.read_bytes())
    assert node.report(cache, "rsync") == {
        "needed": 0, "from_cache": 0, "downloaded": 0, "added": 0, "problem": ""
    }  # fmt: skip
    assert node.downloads() == 0


@pytest.mark.parametrize("args", [[], ["/c"], ["/c", "--archives"], ["/c", "--bogus", "rsync"]])
def test_usage(tmp_path, pool, args):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and proc.stderr.startswith("usage: apt_deb_cache.py CACHE_DIR")
