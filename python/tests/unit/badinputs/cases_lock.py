"""`dscluster lock`: the variant, the Python, the platform, an index URL, the output path."""

from __future__ import annotations

from .harness import Case

LOCK = ["lock", "--variant", "pypi", "--python", "3.12"]

CASES = [
    Case("lock-variant-unknown", ["lock", "--variant", "cu999", "--python", "3.11"], "cu999",
         "use one of cpu, cu126, cu128, cu130, pypi"),
    Case("lock-variant-hpu", ["lock", "--variant", "hpu", "--python", "3.10"], "hpu",
         "ml_stack_habana_compat"),
    Case("lock-python-old", ["lock", "--variant", "cpu", "--python", "3.9"], "3.9",
         "3.10, 3.11, 3.12, 3.13"),
    Case("lock-python-new", ["lock", "--variant", "cpu", "--python", "3.14"], "3.14",
         "3.10, 3.11, 3.12, 3.13"),
    Case("lock-python-word", ["lock", "--variant", "cpu", "--python", "py3"], "py3",
         "3.10, 3.11, 3.12, 3.13"),
    Case("lock-arch", [*LOCK, "--arch", "ppc64le"], "ppc64le", "x86_64, aarch64"),
    Case("lock-index-url", [*LOCK, "--index-url", "pypi.org/simple"], "pypi.org/simple",
         "https://pypi.org/simple"),
    Case("lock-extra-index-url", [*LOCK, "--extra-index-url", "ftp://m/simple"],
         "ftp://m/simple", "--extra-index-url https://"),
    Case("lock-torch-index-url", [*LOCK, "--torch-index-url", "download.pytorch.org"],
         "download.pytorch.org", "--torch-index-url https://download.pytorch.org/whl"),
    Case("lock-out-missing-dir", [*LOCK, "--out", "no/such/dir/x.txt"], "no/such/dir/x.txt",
         "existing directory"),
]  # fmt: skip
