"""Every launch backend, by its `--backend` name: the one list that `trainfleet launch`'s choices
and help, `launch.prepare` and `launch.launch` read.

    >>> list(BACKENDS)
    ['ssh', 'deepspeed']
    >>> backend_for("deepspeed").summary
    "DeepSpeed's own runner (pdsh), each node still given its own environment"

A backend is one module here holding all of it: its plan and `--dry-run` text, its channels and
how each is stopped, its cleanup, its preflight and how its ranks' stacks are dumped
(`launch/backend.py`'s `LaunchBackend`). `ssh.py` (torchrun on every node through trainfleet's
bootstrap) and `deepspeed.py` (DeepSpeed's runner over pdsh) reach their nodes over ssh alike
(`over_ssh.py`). A third (Slurm) is one more module, registered below; `register` also takes one
from outside (a test's).
"""

from __future__ import annotations

from typing import Any

from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import LaunchBackend, Plan
from trainfleet.launch.backends import deepspeed, ssh
from trainfleet.launch.options import DEFAULT_BACKEND

BACKENDS: dict[str, LaunchBackend[Any]] = {}
"""Every launch backend by its `--backend` name, in the order `--help` lists them. Each takes
its own plans (LaunchBackend[ITS_PLAN]); which one a plan goes to is its options.backend, known
when it runs: Any."""


def register(backend: LaunchBackend[Any]) -> LaunchBackend[Any]:
    """Adds `backend` under its name; a name taken is a bug, not a choice."""
    if backend.name in BACKENDS:
        raise ValueError(f"a launch backend named {backend.name!r} is registered already")
    BACKENDS[backend.name] = backend
    return backend


register(ssh.BACKEND)
register(deepspeed.BACKEND)


def backend_for(plan_or_name: Plan | str) -> LaunchBackend[Any]:
    name = plan_or_name if isinstance(plan_or_name, str) else plan_or_name.options.backend
    if name not in BACKENDS:
        raise TrainfleetError(f"no launch backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


def help_text() -> str:
    """`--backend`'s help: each backend's summary, the default said."""
    return "; ".join(
        f"{name}: {backend.summary}{' (default)' if name == DEFAULT_BACKEND else ''}"
        for name, backend in BACKENDS.items()
    )


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "backend_for", "help_text", "register"]
