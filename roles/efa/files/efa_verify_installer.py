#!/usr/bin/env python3
"""Verify the EFA installer tarball's detached signature against a pinned key fingerprint.

Works in a throwaway GNUPGHOME (removed afterwards): reads only the given public key,
refuses it unless its primary fingerprint is the pinned one, then requires gpgv's VALIDSIG
status for the tarball from a keyring holding only that key (no gpg-agent needed). Prints
one line and exits 0 when good; otherwise prints one line naming the file and the reason to
stderr and exits 1.

Usage: efa_verify_installer.py --tarball T --signature S --key K --fingerprint FPR
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile


class VerifyError(Exception):
    pass


def _gpg(home: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["gpg", "--homedir", home, "--batch", "--no-tty", "--status-fd", "1", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def normalize(fpr: str) -> str:
    return "".join(fpr.split()).upper()


def verify(tarball: str, signature: str, key: str, fingerprint: str) -> str:
    pinned = normalize(fingerprint)
    for path in (tarball, signature, key):
        if not os.path.isfile(path):
            raise VerifyError(f"{path} does not exist")
    with tempfile.TemporaryDirectory(prefix="efa-gnupg-") as home:
        os.chmod(home, 0o700)
        shown = _gpg(home, "--with-colons", "--import-options", "show-only", "--import", key)
        fprs = [ln.split(":")[9] for ln in shown.stdout.splitlines() if ln.startswith("fpr:")]
        if shown.returncode != 0 or not fprs:
            raise VerifyError(f"{key} is not an OpenPGP public key")
        if pinned not in fprs:
            raise VerifyError(
                f"{key} has fingerprint {fprs[0]}, expected {pinned}"
                " (efa_installer_key_fingerprint); refusing it"
            )
        # gpgv (which apt itself depends on) checks the signature against a keyring holding
        # only this key; unlike `gpg --import` it needs no gpg-agent on the node.
        keyring = os.path.join(home, "efa.gpg")
        with open(key, "rb") as fh:
            armored = fh.read(64).lstrip().startswith(b"-----BEGIN PGP")
        if armored:
            dearmored = _gpg(home, "--yes", "--output", keyring, "--dearmor", key)
            if dearmored.returncode != 0:
                raise VerifyError(f"gpg could not read {key}: {dearmored.stderr.strip()}")
        else:
            shutil.copyfile(key, keyring)
        checked = subprocess.run(
            ["gpgv", "--status-fd", "1", "--keyring", keyring, signature, tarball],
            capture_output=True,
            text=True,
            check=False,
        )
        status = [ln.split() for ln in checked.stdout.splitlines() if ln.startswith("[GNUPG:]")]
        valid = [s for s in status if len(s) > 2 and s[1] == "VALIDSIG"]
        if checked.returncode != 0 or not valid:
            reason = next(
                (" ".join(s[1:]) for s in status if s[1] in ("BADSIG", "ERRSIG", "NODATA")),
                checked.stderr.strip().splitlines()[-1]
                if checked.stderr.strip()
                else "no signature",
            )
            raise VerifyError(f"signature {signature} does not verify {tarball}: {reason}")
        primary = valid[0][-1]
        if primary != pinned:
            raise VerifyError(f"{tarball} is signed by {primary}, expected {pinned}")
    return f"{tarball}: good signature from {pinned}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tarball", required=True)
    ap.add_argument("--signature", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--fingerprint", required=True)
    args = ap.parse_args(argv)
    try:
        print(verify(args.tarball, args.signature, args.key, args.fingerprint))
    except VerifyError as exc:
        print(f"EFA installer verification failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
