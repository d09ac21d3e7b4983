#!/usr/bin/env bash
# pytest, where "no tests collected" (exit 5) is a failure, said out loud.
set -uo pipefail
cd "$(dirname "$0")/../python"
../.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests for: $*; that is a failure here" >&2
fi
exit "$rc"
