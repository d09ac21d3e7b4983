from __future__ import annotations

from dscluster.smoke import lost_nodes


def test_lost_nodes_from_launcher_log():
    log = [
        "pdsh@n1: n3: ssh exited with exit code 255",
        "n3: ssh: connect to host n3 port 22: No route to host",
        "n2: [2026-11-22 00:45:30,163] [ERROR] [launch.py:335:sigkill_handler] ['python', "
        "'-u', 'smoke_job.py'] exits with return code = -9",
        "n1: [INFO] all good",
    ]
    # n3 was unreachable: n2's rank failing afterwards is a consequence, not a cause.
    assert lost_nodes(log) == {"n3": "ssh: connect to host n3 port 22: No route to host"}
    assert lost_nodes(log[2:]) == {"n2": "a rank exited with code -9"}
    assert lost_nodes(["pdsh@n1: n4: ssh exited with exit code 1"]) == {
        "n4": "remote command exited with code 1"
    }
    assert lost_nodes(["n1: training step 3"]) == {}
