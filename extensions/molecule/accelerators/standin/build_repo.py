#!/usr/bin/env python3
"""Build one stand-in vendor apt repository from a declarative spec (packages.yml).

    build_repo.py SPEC OUTDIR      (GNUPGHOME must hold the key named by repository.key_uid)

The spec names the repository layout (flat, like NVIDIA's CUDA repos, or dists/<suite>,
like Habana's vault), the signing key and the packages: real names and versions, their
Depends and the files they ship. In file contents and Depends, @version@ is the package
version, @upstream@ the version without the Debian revision, and any other @key@ a key of
that version's entry (versions may be plain strings or mappings with extra keys).

Lustre (helper lustre6): @running_kernel@ anywhere in the spec is replaced by
$STANDIN_RUNNING_KERNEL (the kernel the test machine runs, `uname -r`) before the spec is
read; packages of the same name are built once (the first wins, so a running kernel that
equals a listed one is no duplicate); `repository.exclude_running_kernel: true` drops every
package named for the running kernel (the "mismatch" repositories); `repository.pool`
places the pool of a dists layout elsewhere than pool/<component> (FSx: pool/<suite>/l/lu).
"""

import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml


def substitute(text, values):
    def repl(match):
        key = match.group(1)
        if key not in values:
            raise SystemExit(f"@{key}@ is not defined for {values['package']} {values['version']}")
        return str(values[key])

    return re.sub(r"@([a-z_]+)@", repl, text)


def build_deb(pkg, entry, pool, workdir):
    values = dict(entry) if isinstance(entry, dict) else {"version": entry}
    values["version"] = str(values["version"])
    values["package"] = pkg["name"]
    values["upstream"] = values["version"].rsplit("-", 1)[0]
    root = os.path.join(workdir, f"{pkg['name']}_{values['version']}")
    os.makedirs(os.path.join(root, "DEBIAN"))
    for path, entry_spec in (pkg.get("files") or {}).items():
        spec = entry_spec if isinstance(entry_spec, dict) else {"content": entry_spec}
        dest = os.path.join(root, substitute(path, values).lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w") as fh:
            fh.write(substitute(spec.get("content", ""), values))
        os.chmod(dest, int(str(spec.get("mode", "0644")), 8))
    control = [
        f"Package: {pkg['name']}",
        f"Version: {values['version']}",
        f"Architecture: {pkg.get('architecture', 'amd64')}",
        "Maintainer: dscluster stand-in <standin@dscluster.invalid>",
        f"Section: {pkg.get('section', 'misc')}",
        "Priority: optional",
    ]
    if pkg.get("depends"):
        control.append(f"Depends: {substitute(pkg['depends'], values)}")
    summary = pkg.get("description", pkg["name"])
    control.append(f"Description: {summary} (stand-in)")
    control.append(" Stand-in package of the dscluster test repository: the real name and")
    control.append(" version, none of the real contents.")
    with open(os.path.join(root, "DEBIAN", "control"), "w") as fh:
        fh.write("\n".join(control) + "\n")
    deb = os.path.join(
        pool, f"{pkg['name']}_{values['version']}_{pkg.get('architecture', 'amd64')}.deb"
    )
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, deb],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def sign(release_dir, uid):
    release = os.path.join(release_dir, "Release")
    base = ["gpg", "--batch", "--yes", "--local-user", uid]
    subprocess.run([*base, "--armor", "--detach-sign", "-o", release + ".gpg", release], check=True)
    subprocess.run(
        [*base, "--clearsign", "-o", os.path.join(release_dir, "InRelease"), release], check=True
    )


def write_packages(repo_root, pool_rel, dest_dir):
    os.makedirs(dest_dir, exist_ok=True)
    out = subprocess.run(
        ["apt-ftparchive", "packages", pool_rel],
        cwd=repo_root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with open(os.path.join(dest_dir, "Packages"), "w") as fh:
        fh.write(out)
    with gzip.open(os.path.join(dest_dir, "Packages.gz"), "wt") as fh:
        fh.write(out)


def release(repo, target, cwd, extra):
    opts = [
        f"-oAPT::FTPArchive::Release::Origin={repo['origin']}",
        f"-oAPT::FTPArchive::Release::Label={repo['label']}",
        "-oAPT::FTPArchive::Release::Architectures=amd64",
        *extra,
    ]
    out = subprocess.run(
        ["apt-ftparchive", *opts, "release", target],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with open(os.path.join(cwd, target, "Release"), "w") as fh:
        fh.write(out)


def export_key(uid, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    key = subprocess.run(
        ["gpg", "--armor", "--export", uid], check=True, capture_output=True
    ).stdout
    with open(dest, "wb") as fh:
        fh.write(key)
    # The fingerprint the scenario pins, as a vendor's docs would publish it.
    colons = subprocess.run(
        ["gpg", "--with-colons", "--fingerprint", uid], check=True, capture_output=True, text=True
    ).stdout
    fpr = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    with open(dest + ".fingerprint", "w") as fh:
        fh.write(fpr + "\n")


def load_spec(spec_path):
    with open(spec_path) as fh:
        text = fh.read()
    kernel = os.environ.get("STANDIN_RUNNING_KERNEL", "")
    if "@running_kernel@" in text:
        if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*", kernel):
            raise SystemExit(
                f"{spec_path}: STANDIN_RUNNING_KERNEL={kernel!r} is not a kernel release usable"
                " in a Debian package name (uname -r, lowercase)"
            )
        text = text.replace("@running_kernel@", kernel)
    spec = yaml.safe_load(text)
    seen, packages = set(), []
    for pkg in spec["packages"]:
        if pkg["name"] in seen:
            continue
        if (
            spec["repository"].get("exclude_running_kernel")
            and kernel
            and pkg["name"].endswith("-" + kernel)
        ):
            continue
        seen.add(pkg["name"])
        packages.append(pkg)
    spec["packages"] = packages
    return spec


def main():
    spec_path, outdir = sys.argv[1], sys.argv[2]
    spec = load_spec(spec_path)
    repo = spec["repository"]
    root = os.path.join(outdir, repo["path"])
    workdir = tempfile.mkdtemp()
    try:
        if repo["layout"] == "flat":
            pool = root
            os.makedirs(pool, exist_ok=True)
        else:
            pool = os.path.join(root, repo.get("pool", os.path.join("pool", repo["component"])))
            os.makedirs(pool, exist_ok=True)
        for pkg in spec["packages"]:
            for entry in pkg["versions"]:
                build_deb(pkg, entry, pool, workdir)
    finally:
        shutil.rmtree(workdir)

    if repo["layout"] == "flat":
        write_packages(root, ".", root)
        release(repo, ".", root, [])
        sign(root, repo["key_uid"])
    else:
        suite, comp = repo["suite"], repo["component"]
        dist = os.path.join("dists", suite)
        write_packages(
            root,
            repo.get("pool", os.path.join("pool", comp)),
            os.path.join(root, dist, comp, "binary-amd64"),
        )
        release(
            repo,
            dist,
            root,
            [
                f"-oAPT::FTPArchive::Release::Suite={suite}",
                f"-oAPT::FTPArchive::Release::Codename={suite}",
                f"-oAPT::FTPArchive::Release::Components={comp}",
            ],
        )
        sign(os.path.join(root, dist), repo["key_uid"])
    export_key(repo["key_uid"], os.path.join(outdir, repo["key_path"]))
    count = sum(len(p["versions"]) for p in spec["packages"])
    print(f"[standin] {repo['path']}: {count} packages, key {repo['key_path']}", file=sys.stderr)


if __name__ == "__main__":
    main()
