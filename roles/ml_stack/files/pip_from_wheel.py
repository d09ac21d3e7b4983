"""Run pip out of the system's pip wheel, in a venv made without pip.

Run as `<venv>/bin/python -c <this file> WHEELS_DIR pip-args...` by
roles/ml_stack/tasks/install.yml: puts the newest pip-*.whl in WHEELS_DIR (Debian's
/usr/share/python-wheels, what ensurepip installs from) on sys.path and runs pip's __main__,
as `python pip.whl/pip` does, installing into the venv that runs it. Exits 1 naming the
directory when it holds no pip wheel.
"""

import glob
import runpy
import sys

found = sorted(glob.glob(sys.argv[1] + "/pip-*.whl"))
if not found:
    sys.exit(f"no pip wheel in {sys.argv[1]}: install python3-pip-whl")
sys.path.insert(0, found[-1])
sys.argv[:2] = ["pip"]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
