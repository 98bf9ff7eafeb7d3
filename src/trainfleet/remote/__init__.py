"""Run one argv on many nodes at once through the system OpenSSH client; results as data.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.remote import run_on_nodes
    >>> [r.stdout for r in run_on_nodes(load_cluster().nodes, ["echo", "hi"])]
    ['hi\\n']

System `ssh`, not a Python SSH stack, so ~/.ssh/config aliases, agents, jump hosts and
HostKeyAlgorithms behave exactly as `ssh host` does. Every node gets its own process at the same
moment (asyncio, no per-node serial step); connections are reused through ControlMaster.
A node that is this machine (`localhost`) runs the argv directly. Failures are classified into
the `Failure` classes that doctor turns into findings (docs/findings.md).
"""

from trainfleet.remote.argv import (
    CONTROL_PERSIST_S,
    close_connections,
    control_dir,
    node_argv,
    ssh_base_argv,
    ssh_hostnames,
    ssh_options,
)
from trainfleet.remote.failures import Failure, NodeResult, classify
from trainfleet.remote.run import (
    LineCallback,
    PerNode,
    Watch,
    command_argv,
    run_on_nodes,
    run_on_nodes_async,
    worst_returncode,
)

__all__ = [
    "CONTROL_PERSIST_S",
    "Failure",
    "LineCallback",
    "NodeResult",
    "PerNode",
    "classify",
    "close_connections",
    "command_argv",
    "control_dir",
    "node_argv",
    "run_on_nodes",
    "run_on_nodes_async",
    "ssh_base_argv",
    "ssh_hostnames",
    "ssh_options",
    "Watch",
    "worst_returncode",
]
