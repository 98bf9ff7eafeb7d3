"""Finding the processes a `trainfleet train` job leaves behind, and the marks every module of
`trainfleet train` sandbox tests carries (test helpers)."""

from __future__ import annotations

import importlib.util

import pytest

from session_scope import own_cmdlines

PYTESTMARK = [
    pytest.mark.cluster,
    pytest.mark.usefixtures("no_train_job_left_behind"),
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("deepspeed", "transformers", "datasets")),
        reason="needs deepspeed, transformers and datasets (`make venv` installs them)",
    ),
]


def train_job_processes() -> list[str]:
    """`pid: cmdline` of every rank, torchrun agent or bootstrap of a train job this test
    process started, still running here or on one of its sandboxes' nodes (every sandbox node
    shares this machine's process table)."""
    marks = ("trainfleet.train.worker", "trainfleet-bootstrap")
    return [f"{pid}: {c[:120]}" for pid, c in own_cmdlines().items() if any(m in c for m in marks)]
