"""`make demo`: a 3-node sandbox, `trainfleet exec -- hostname` on it, and teardown.

    python -m trainfleet.demo

Runs the same CLI a user types; needs root (network namespaces). The sandbox is always taken
down, also when a step fails or on Ctrl-C.
"""

from __future__ import annotations

import shlex
import sys

from trainfleet import sandbox
from trainfleet.cli.main import main as trainfleet

DEMO_NAME = "demo"


def _step(argv: list[str]) -> int:
    print(f"\n$ trainfleet {shlex.join(argv)}", flush=True)
    return trainfleet(argv)


def run_demo() -> int:
    cluster_file = sandbox.lifecycle.state_root() / DEMO_NAME / "cluster.yaml"
    up = ["sandbox", "up", "--name", DEMO_NAME, "--nodes", "3"]
    if _step([*up, "--ifnames", "ens14f0,ens14f1,ens14f2"]) != 0:
        return 1
    try:
        return _step(["exec", "-c", str(cluster_file), "--", "hostname"])
    finally:
        _step(["sandbox", "down", "--name", DEMO_NAME])


if __name__ == "__main__":
    sys.exit(run_demo())
