"""The doctor checks that end each setup step: doctor's own probe and check functions.

    >>> SSH.label
    'ssh: this machine to every node, every node to every node (N x N)'
    >>> [check.__name__ for check in SSH.checks]
    ['check_launch_ssh', 'check_node_to_node_ssh']

Setup never re-implements a check: it collects fresh facts with doctor's probe and runs the
check functions that cover what the step changed, so "fixed" means what doctor means by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster
from trainfleet.doctor.checks import network, resources, software, ssh
from trainfleet.doctor.collect import Survey, collect
from trainfleet.doctor.findings import Finding, merge

PROBE_PYTHON = "python3"
"""What runs doctor's probe for `setup ssh`: any stdlib python3 on the node's PATH, because
fresh servers do not have the training environment that cluster.yaml's `python:` names."""


@dataclass(frozen=True, slots=True)
class CheckSet:
    label: str
    checks: tuple[Callable[[Survey], list[Finding]], ...]
    quick: bool
    """doctor --quick is enough (no node-to-node ssh, no imports, no code hash)."""
    tcp: bool = False
    """The checks read the node-to-node TCP tests. Without them no probe listens, so a survey
    never waits out the connect bound on ports that a firewall drops (before `setup firewall`
    every survey of such a cluster did: about 8 s each)."""


SSH = CheckSet(
    "ssh: this machine to every node, every node to every node (N x N)",
    (ssh.check_launch_ssh, ssh.check_node_to_node_ssh),
    quick=False,
)
HOSTFILE = CheckSet(
    FindingId.GPU_COUNT_MISMATCH.value, (ssh.check_launch_ssh, resources.check_gpus), quick=True
)
ENV = CheckSet(
    "interfaces, paths, non-interactive environment",
    (
        ssh.check_launch_ssh,
        software.check_paths,
        network.check_interfaces,
        software.check_tools,
        software.check_gpu_software,
    ),
    quick=True,
)
FIREWALL = CheckSet(
    f"{FindingId.FIREWALL_BLOCKS_PORTS} (TCP between every pair of nodes)",
    (ssh.check_launch_ssh, network.check_firewall),
    quick=True,
    tcp=True,
)
HOSTS = CheckSet(
    f"{FindingId.HOSTNAME_UNRESOLVABLE} (names of the IPv4-mapped addresses c10d looks up)",
    (ssh.check_launch_ssh, network.check_client_names),
    quick=True,
)
PYENV = CheckSet(
    f"{FindingId.VERSION_MISMATCH}, {FindingId.TORCH_MISSING} (package metadata)",
    (ssh.check_launch_ssh, software.check_versions, software.check_torch),
    quick=True,
)
SYNC = CheckSet(
    f"{FindingId.CODE_DIFFERS}, {FindingId.SHARED_DIR_MISSING}",
    (
        ssh.check_launch_ssh,
        software.check_paths,
        software.check_code,
        resources.check_shared_storage,
    ),
    quick=False,
)


def survey(cluster: Cluster, check_set: CheckSet, *, probe_python: str | None = None) -> Survey:
    """Fresh facts from every node, as doctor gathers them."""
    if probe_python:
        nodes = tuple(replace(node, python=probe_python) for node in cluster.nodes)
        cluster = replace(cluster, nodes=nodes)
    return collect(cluster, quick=check_set.quick, tcp=check_set.tcp)


def findings(survey: Survey, check_set: CheckSet) -> list[Finding]:
    return merge(finding for check in check_set.checks for finding in check(survey))
