"""Finding the processes a `trainfleet train` job leaves behind (test helper)."""

from __future__ import annotations

import os
from pathlib import Path


def train_job_processes() -> list[str]:
    """`pid: cmdline` of every rank, torchrun agent or bootstrap of a train job still running
    anywhere on this machine (every sandbox node shares its process table)."""
    left = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if "trainfleet.train.worker" in cmdline or "trainfleet-bootstrap" in cmdline:
            left.append(f"{entry}: {cmdline[:120]}")
    return left
