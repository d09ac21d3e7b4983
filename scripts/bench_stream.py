#!/usr/bin/env python3
"""make bench's `stream` step: how soon a job's step lines reach the console of `dscluster launch`.

    bench_stream.py INVENTORY PORT

Runs `dscluster launch` (no doctor) of a ticker script whose rank 0 prints its clock with
each of 10 steps (`TICK n <time>`, then `DSCLUSTER_STEP n`), 0.5 s apart, and prints one JSON
object: launch_to_first_step_s (from starting the command to the first step line on its
stdout: staging, the supervisor's start, the launcher's start, the stream) and the median and
largest step_line_delay_s (each line's arrival less the time the rank printed it: the stream
alone; the nodes share this machine's clock).
"""

from __future__ import annotations

import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

TICKER = """\
import os, sys, time
rank = int(os.environ.get("RANK", "0"))
for step in range(1, 11):
    if rank == 0:
        os.write(1, f"TICK {step} {time.time():.3f}\\n".encode())
        os.write(1, f"DSCLUSTER_STEP {step}\\n".encode())
    time.sleep(0.5)
"""


def main(argv: list[str]) -> int:
    inventory, port = argv
    with tempfile.TemporaryDirectory() as tmp:
        script = pathlib.Path(tmp) / "bench_ticker.py"
        script.write_text(TICKER)
        cmd = [sys.executable, "-m", "dscluster", "launch", "-i", inventory, "--no-doctor"]
        cmd += ["--master-port", port, "--timeout", "300", "--", str(script)]
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        first, delays = None, []
        for line in proc.stdout:
            if m := re.search(r"TICK (\d+) (\d+\.\d+)", line):
                now = time.time()
                first = first if first is not None else round(now - t0, 2)
                delays.append(now - float(m[2]))
        rc = proc.wait()
    ok = rc == 0 and first is not None and len(delays) == 10
    print(json.dumps({
        "launch_to_first_step_s": first if ok else "failed",
        "step_line_delay_median_s": round(statistics.median(delays), 3) if ok else "failed",
        "step_line_delay_max_s": round(max(delays), 3) if ok else "failed",
    }))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
