"""`dscluster lock` against a stand-in package index served on loopback (real uv; wheel files
made here, as a build backend writes them: torch, einops in two versions, setuptools, wheel;
DeepSpeed's sdist), and its refusals before anything is contacted."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import io
import pathlib
import re
import tarfile
import threading
import zipfile

import pytest
import yaml

from dscluster import lock
from dscluster.cli import main
from dscluster.errors import DsclusterError


def wheel(folder: pathlib.Path, name: str, version: str, requires_python: str = "") -> bytes:
    """A pure-Python wheel of one empty module, as a build backend writes it."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + (f"Requires-Python: {requires_python}\n" if requires_python else "")
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
            for path, data in files.items()
        )
        + f"{dist}/RECORD,,\n"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            zf.writestr(path, data)
    target = folder / f"{name}-{version}-py3-none-any.whl"
    target.write_bytes(buf.getvalue())
    return target.read_bytes()


def publish(index: pathlib.Path, project: str, files: list[pathlib.Path]) -> None:
    """A PEP 503 project page listing `files` with their sha256."""
    page = index / project
    page.mkdir(parents=True, exist_ok=True)
    links = []
    for path in files:
        (page / path.name).write_bytes(path.read_bytes())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        links.append(f'<a href="{path.name}#sha256={digest}">{path.name}</a>')
    (page / "index.html").write_text("<html><body>" + "\n".join(links) + "</body></html>\n")


@pytest.fixture
def index(tmp_path: pathlib.Path):
    """http://127.0.0.1:PORT serving simple/ (PyPI's stand-in) and whl/cpu/ (PyTorch's)."""
    root, made = tmp_path / "served", tmp_path / "made"
    made.mkdir()
    simple, cpu = root / "simple", root / "whl" / "cpu"
    wheel(made, "torch", "2.13.0")
    publish(simple, "torch", [made / "torch-2.13.0-py3-none-any.whl"])
    wheel(made, "torch", "2.13.0+cpu")
    publish(cpu, "torch", [made / "torch-2.13.0+cpu-py3-none-any.whl"])
    wheel(made, "einops", "0.8.2", requires_python=">=3.11")
    wheel(made, "einops", "0.8.1")
    publish(simple, "einops", sorted(made.glob("einops-*.whl")))
    wheel(made, "wheel", "0.48.0")
    publish(simple, "wheel", [made / "wheel-0.48.0-py3-none-any.whl"])
    wheel(made, "setuptools", "84.2.1")
    publish(simple, "setuptools", [made / "setuptools-84.2.1-py3-none-any.whl"])
    sdist = made / "deepspeed-0.19.8.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        data = b"Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n"
        info = tarfile.TarInfo("deepspeed-0.19.8/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    publish(simple, "deepspeed", [sdist])

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", made
    finally:
        server.shutdown()


@pytest.fixture
def collection(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
    """A collection whose ml_stack defaults name one DeepSpeed requirement (einops), and
    whose shipped cp311 cpu lock pins einops 0.8.2, which needs Python 3.11."""
    root = tmp_path / "collection"
    (root / "roles/ml_stack/defaults").mkdir(parents=True)
    (root / "roles/ml_stack/files/locks").mkdir(parents=True)
    defaults = {
        "ml_stack_torch_version": "2.13.0",
        "ml_stack_deepspeed_version": "0.19.8",
        "ml_stack_deepspeed_requirements": ["einops"],
        "ml_stack_torch_index_url": "https://download.pytorch.org/whl",
    }
    (root / "roles/ml_stack/defaults/main.yml").write_text(yaml.safe_dump(defaults))
    (root / "roles/ml_stack/files/locks/cpu-torch2.13.0-ds0.19.8-cp311-x86_64.txt").write_text(
        "einops==0.8.2 \\\n    --hash=sha256:00\ntorch==2.13.0+cpu \\\n    --hash=sha256:00\n"
    )
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return root


def pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z][a-z0-9._-]*)==(\S+)", text, re.MULTILINE))


def test_a_lock_follows_the_reference_pins_and_its_index_digests(index, collection, tmp_path):
    """pypi for 3.11: the reference lock's einops, every file's sha256 as the index serves it,
    DeepSpeed's sdist line last, the header naming the command; for 3.10 einops 0.8.2 has
    no usable wheel: the pin is left to uv (0.8.1) and the header says so."""
    url, made = index
    locks = collection / "roles/ml_stack/files/locks"
    req = lock.request_from(collection, variant="pypi", python="3.11", index_url=f"{url}/simple")
    assert req.name == "pypi-torch2.13.0-ds0.19.8-cp311-x86_64.txt"
    text = lock.make_lock(req, locks, tmp_path / req.name).read_text()
    assert pins(text) == {
        "einops": "0.8.2", "setuptools": "84.2.1",
        "torch": "2.13.0", "wheel": "0.48.0", "deepspeed": "0.19.8",
    }  # fmt: skip
    wanted = [list(pin) for pin in pins(text).items()]
    locked = [p for p in made.glob("*") if p.name.removesuffix(".tar.gz").split("-")[:2] in wanted]
    assert len(locked) == 5  # torch, einops, setuptools, wheel, the sdist
    for path in locked:
        assert hashlib.sha256(path.read_bytes()).hexdigest() in text, path.name
    assert text.rstrip().endswith(
        "deepspeed==0.19.8 \\\n    --hash=sha256:"
        + hashlib.sha256((made / "deepspeed-0.19.8.tar.gz").read_bytes()).hexdigest()
    )
    assert "`dscluster lock --variant pypi --python 3.11 --arch x86_64`" in " ".join(
        line.removeprefix("# ") for line in text.splitlines() if line.startswith("#")
    )
    assert "except" not in text
    old = lock.request_from(collection, variant="pypi", python="3.10", index_url=f"{url}/simple")
    text = lock.make_lock(old, locks, tmp_path / old.name).read_text()
    assert pins(text)["einops"] == "0.8.1"
    assert "except einops==0.8.2 (no wheels for this Python)" in text.replace("\n# ", " ")


def test_a_pytorch_variant_takes_its_index_with_the_local_label(index, collection, tmp_path):
    url, _ = index
    req = lock.request_from(
        collection, variant="cpu", python="3.11", index_url=f"{url}/simple",
        torch_index_url=f"{url}/whl",
    )  # fmt: skip
    assert req.torch_spec == "torch==2.13.0+cpu"
    assert req.index_args()[-4:] == [
        "--extra-index-url", f"{url}/whl/cpu", "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    text = lock.make_lock(
        req, collection / "roles/ml_stack/files/locks", tmp_path / "l"
    ).read_text()
    assert pins(text)["torch"] == "2.13.0+cpu"
    # an index without that build: uv's own reason, in one line
    gone = dataclasses.replace(req, torch_index_url=f"{url}/nowhere")
    with pytest.raises(DsclusterError) as refused:
        lock.make_lock(gone, collection / "roles/ml_stack/files/locks", tmp_path / "m")
    line = str(refused.value)
    assert (
        line.startswith("uv could not lock torch==2.13.0+cpu for cp311 x86_64 (")
        and "\n" not in line
    )
    assert f"--extra-index-url {url}/nowhere/cpu" in line and not (tmp_path / "m").exists()


def test_an_unreachable_index_is_one_line(collection, tmp_path):
    req = lock.request_from(
        collection, variant="pypi", python="3.12", index_url="http://127.0.0.1:9/simple"
    )
    with pytest.raises(DsclusterError) as refused:
        lock.make_lock(req, collection / "roles/ml_stack/files/locks", tmp_path / "x.txt")
    line = str(refused.value)
    assert line.startswith("cannot read http://127.0.0.1:9/simple/deepspeed/ (")
    assert "\n" not in line and "check --index-url" in line
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--variant", "cu999", "--python", "3.11"], "--variant 'cu999' is not a torch build"),
        (["--variant", "hpu", "--python", "3.10"], "--variant hpu has no lock to make"),
        (["--variant", "pypi", "--python", "3.9"], "--python '3.9' is not one the nodes run"),
        (["--variant", "pypi", "--python", "3.14"], "use one of 3.10, 3.11, 3.12, 3.13"),
        (["--variant", "pypi", "--python", "3.12", "--arch", "ppc64le"], "--arch 'ppc64le'"),
        (["--variant", "pypi", "--python", "3.12", "--index-url", "pypi.org"], "--index-url"),
        (["--variant", "pypi", "--python", "3.12", "--out", "/nonexistent/x.txt"], "--out"),
    ],
)
def test_bad_values_are_one_line_and_nothing_is_contacted(
    words, said, capsys, monkeypatch, tmp_path
):
    def contacted(*args, **kwargs):
        raise AssertionError("contacted an index before refusing")

    monkeypatch.setattr(lock.urllib.request, "urlopen", contacted)
    monkeypatch.setattr(lock.subprocess, "run", contacted)
    monkeypatch.chdir(tmp_path)
    assert main(["lock", *words]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dscluster: error: ") and "\n" not in err and said in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_shipped_pypi_locks_are_the_commands_own():
    """Every shipped pypi lock names the command that makes it and ends in DeepSpeed's sdist
    with the same digest (make locks rewrites them)."""
    from dscluster import paths  # noqa: PLC0415

    locks = paths.collection_root() / "roles/ml_stack/files/locks"
    shipped = sorted(locks.glob("pypi-*.txt"))
    assert [p.name.split("-")[3] for p in shipped] == ["cp310", "cp311", "cp312", "cp313"]
    digests = set()
    for path in shipped:
        text = path.read_text()
        tag = path.name.split("-")[3]
        python = f"{tag[2]}.{tag[3:]}"
        if tag != "cp313":  # shipped before the command; its body is the command's (by hand)
            flat = text.replace("\n# ", " ")
            assert f"`dscluster lock --variant pypi --python {python} --arch x86_64`" in flat
        digests.add(re.search(r"deepspeed==0\.19\.8 \\\n +--hash=sha256:(\w+)\n\Z", text)[1])
        assert "torch==2.13.0 \\" in text
    assert len(digests) == 1
