"""Which collection and node image sources dscluster drives (paths.collection_root, docker_dir)."""

from __future__ import annotations

import pathlib

import pytest

from dscluster import paths


def _node_sources(docker: pathlib.Path) -> None:
    (docker / "node").mkdir(parents=True)
    (docker / "base-image.sh").write_text("#!/bin/sh\n")


def _collection(root: pathlib.Path) -> pathlib.Path:
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "site.yml").write_text("---\n")
    (root / "roles").mkdir()
    _node_sources(root / "docker")
    return root


@pytest.fixture
def layout(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    """A package dir whose shipped copy and editable record the test fills in."""
    package = tmp_path / "site-packages" / "dscluster"
    package.mkdir(parents=True)
    shipped = package / "_collection" / "ansible_collections" / "dscluster" / "cluster"
    monkeypatch.setattr(paths, "_SHIPPED", shipped)
    monkeypatch.setattr(paths, "_SHIPPED_DOCKER", package / "_docker")
    monkeypatch.setattr(paths, "_EDITABLE", package / "_source_tree")
    monkeypatch.delenv("DSCLUSTER_COLLECTION", raising=False)
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(tmp_path / "no-galaxy"))
    paths.collection_root.cache_clear()
    yield package, shipped
    paths.collection_root.cache_clear()


def test_an_editable_clone_wins_over_a_copy_staged_by_a_build(layout, tmp_path):
    """make test builds the wheel in the clone (the copy staged in src/ for seconds) while
    e2e commands run from the same clone: they must keep to the clone, whose files stay."""
    package, shipped = layout
    clone = _collection(tmp_path / "clone")
    (package / "_source_tree").write_text(f"{clone}\n")
    _collection(shipped)
    _node_sources(package / "_docker")
    assert paths.collection_root() == clone.resolve()
    assert paths.docker_dir() == clone.resolve() / "docker"


def test_an_installed_wheel_uses_its_shipped_copy(layout):
    package, shipped = layout
    _collection(shipped)
    _node_sources(package / "_docker")
    assert paths.collection_root() == shipped.resolve()
    assert paths.docker_dir() == package / "_docker"


def test_an_editable_record_of_a_removed_clone_falls_through(layout, tmp_path):
    package, shipped = layout
    (package / "_source_tree").write_text(f"{tmp_path / 'gone'}\n")
    _collection(shipped)
    assert paths.collection_root() == shipped.resolve()


def test_nothing_found_names_the_fixes(layout):
    with pytest.raises(paths.DsclusterError, match="reinstall dscluster"):
        paths.collection_root()
