"""Scripts to launch: small real jobs for the demo, the tests and the benches."""

from pathlib import Path

ALLREDUCE = Path(__file__).with_name("allreduce.py")
"""A gloo all_reduce across every rank; prints `rank R/W sum=S GLOO_SOCKET_IFNAME=...`."""
