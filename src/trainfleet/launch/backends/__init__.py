"""Every launch backend, by its `--backend` name: the one list that `trainfleet launch`'s choices
and help, `launch.prepare` and `launch.launch` read.

    >>> list(BACKENDS)
    ['ssh', 'deepspeed', 'slurm']
    >>> backend_for("deepspeed").summary
    "DeepSpeed's own runner (pdsh), each node still given its own environment"

A backend is one module here holding all of it: its plan and `--dry-run` text, its channels and
how each is stopped, its cleanup, its preflight and how its ranks' stacks are dumped
(`launch/backend.py`'s `LaunchBackend`). `ssh.py` (torchrun on every node through trainfleet's
bootstrap) and `deepspeed.py` (DeepSpeed's runner over pdsh) reach their nodes over ssh alike
(`over_ssh.py`). `slurm.py` is the ssh backend's plan with each node's bootstrap started as a
step of the Slurm job the launch runs in; it is the default there (`default_for`). `register`
also takes a backend from outside (a test's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainfleet.cluster import Cluster
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import LaunchBackend, Plan
from trainfleet.launch.backends import deepspeed, slurm, ssh
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
register(slurm.BACKEND)


def backend_for(plan_or_name: Plan | str) -> LaunchBackend[Any]:
    name = plan_or_name if isinstance(plan_or_name, str) else plan_or_name.options.backend
    if name not in BACKENDS:
        raise TrainfleetError(f"no launch backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


def default_for(cluster: Cluster) -> str:
    """The backend a launch on `cluster` uses unless --backend says: `slurm` for the nodes of
    the Slurm job it runs in, else DEFAULT_BACKEND."""
    in_job = bool(cluster.nodes) and all(node.slurm is not None for node in cluster.nodes)
    return slurm.BACKEND.name if in_job else DEFAULT_BACKEND


def help_text(names: Iterable[str] | None = None) -> str:
    """`--backend`'s help: each backend's summary (those named, else all), the default said."""
    return "; ".join(
        f"{name}: {BACKENDS[name].summary}{_default_said(name)}" for name in names or BACKENDS
    )


def _default_said(name: str) -> str:
    if name == DEFAULT_BACKEND:
        return " (default)"
    return " (default inside a Slurm job)" if name == slurm.BACKEND.name else ""


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "backend_for", "default_for", "help_text", "register"]
