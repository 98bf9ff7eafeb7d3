"""Scripts to launch: small real jobs for the demo, the tests and the benches."""

from pathlib import Path

ALLREDUCE = Path(__file__).with_name("allreduce.py")
"""A gloo all_reduce across every rank; prints `rank R/W sum=S GLOO_SOCKET_IFNAME=...`."""

HEARTBEAT_LOOP = Path(__file__).with_name("heartbeat_loop.py")
"""Steps that compute, all-reduce and send heartbeats; `--slow-rank R` makes a straggler."""
