"""Cluster spec: which nodes, how to reach them, how many ranks each runs.

    >>> from trainfleet.cluster import load_cluster
    >>> cluster = load_cluster(hosts="gpu-node-1:8,gpu-node-2:8", include="gpu-node-2:0,1")
    >>> [(n.host, n.slots, n.gpu_ids) for n in cluster.nodes]
    [('gpu-node-2', 2, (0, 1))]

Three sources give one model: a DeepSpeed hostfile (`host slots=N`, read as DeepSpeed's runner
reads it, but refusing what it would read only in part: `slots=8;reboot`), a cluster.yaml, or
`--hosts a,b,c`. With none, this machine is a one-node cluster. DeepSpeed's `--include/--exclude`
NODE_SPEC filters (`worker-0@worker-1:0,2`) apply to any source. Every value that can reach a
remote shell is checked here, once, so that nothing a user did not ask for is ever executed.
"""

from __future__ import annotations

from trainfleet.cluster.dshostfile import filter_nodes, parse_hostfile
from trainfleet.cluster.load import load_cluster
from trainfleet.cluster.model import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MASTER_PORT,
    LOCAL_HOSTS,
    Cluster,
    Node,
    SshOptions,
)
from trainfleet.cluster.validate import check_host
from trainfleet.cluster.yaml_spec import parse_cluster_yaml

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MASTER_PORT",
    "LOCAL_HOSTS",
    "Cluster",
    "Node",
    "SshOptions",
    "check_host",
    "filter_nodes",
    "load_cluster",
    "parse_cluster_yaml",
    "parse_hostfile",
]
