"""A file's sha256, read in blocks: the one digest helper of the ml_stack scripts.

Imported from the directory of the script that uses it: on the controller from the role's
files/ (hash_wheels.py, user_layer.py), on a node from /opt/dscluster/bin, where the role
installs it beside record_versions.py. Standard library only.
"""

import hashlib
import pathlib


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
