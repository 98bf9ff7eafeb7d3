"""`make demo`: a 3-node sandbox, `doctor` on it (clean, then with a firewall fault), `exec`,
`launch` of a real gloo all_reduce across the nodes, and teardown.

    python -m trainfleet.demo

Runs the same CLI a user types; needs root (network namespaces). The sandbox is always taken
down, also when a step fails or on Ctrl-C.
"""

from __future__ import annotations

import shlex
import sys

from trainfleet import sandbox
from trainfleet.cli.main import main as trainfleet
from trainfleet.examples import ALLREDUCE

DEMO_NAME = "demo"
IFNAMES = "ens14f0,ens14f1,ens14f2"


def _step(argv: list[str]) -> int:
    print(f"\n$ trainfleet {shlex.join(argv)}", flush=True)
    return trainfleet(argv)


def run_demo() -> int:
    cluster_file = str(sandbox.lifecycle.state_root() / DEMO_NAME / "cluster.yaml")
    up = ["sandbox", "up", "--name", DEMO_NAME, "--nodes", "3", "--ifnames", IFNAMES]
    down = ["sandbox", "down", "--name", DEMO_NAME]
    if _step(up) != 0:
        return 1
    try:
        if _step(["doctor", "-c", cluster_file]) != 0:
            return 1
        if _step(["exec", "-c", cluster_file, "--", "hostname"]) != 0:
            return 1
        # Each node has its own interface name: launch gives each its own GLOO_SOCKET_IFNAME.
        if _step(["launch", "-c", cluster_file, "--", str(ALLREDUCE)]) != 0:
            return 1
    finally:
        _step(down)
    # The seeds' worst case: ssh and port 29500 pass, NCCL's random ports are dropped.
    print("\n# the same cluster with a firewall on gpu-node-1 that drops all but ssh and 29500:")
    if _step([*up, "--fault", "firewall-blocks-ports@1"]) != 0:
        return 1
    try:
        found = _step(["doctor", "-c", cluster_file, "--quick"])
    finally:
        _step(down)
    return 0 if found == 1 else 1  # doctor must have found the error


if __name__ == "__main__":
    sys.exit(run_demo())
