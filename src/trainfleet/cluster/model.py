"""The cluster model: nodes, how to reach them, cluster-wide settings (validated values only:
the parsers in this package build them).

    >>> node = Node(host="gpu-node-1", slots=8, gpu_ids=tuple(range(8)), python="python3")
    >>> Cluster(nodes=(node,), master="gpu-node-1").world_size
    8
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MASTER_PORT = 29500
"""torchrun's and DeepSpeed's default rendezvous port."""

DEFAULT_CONNECT_TIMEOUT = 10
"""Seconds for ssh's TCP connect + handshake when the spec does not say."""

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Names that mean this machine; such a node runs commands without ssh."""


@dataclass(kw_only=True, slots=True, frozen=True)
class SshOptions:
    """How to reach a node with the system OpenSSH client. Unset fields leave ssh's own default
    (including whatever ~/.ssh/config says for that host)."""

    user: str | None = None
    """Remote login name (`ssh -l`)."""
    port: int | None = None
    """sshd port (`ssh -p`)."""
    identity_file: str | None = None
    """Private key (`ssh -i`)."""
    known_hosts_file: str | None = None
    """known_hosts file to check host keys against (`UserKnownHostsFile`)."""
    config_file: str | None = None
    """ssh config file used instead of ~/.ssh/config (`ssh -F`)."""
    options: tuple[str, ...] = ()
    """Extra ssh arguments, passed before trainfleet's own (OpenSSH keeps the first value)."""
    connect_timeout: int | None = None
    """Seconds to wait for the TCP connect + ssh handshake before calling a node unreachable
    (None: DEFAULT_CONNECT_TIMEOUT)."""

    def merged_over(self, base: SshOptions) -> SshOptions:
        """These per-node options on top of cluster-wide `base`; node options come first."""
        return SshOptions(
            user=self.user if self.user is not None else base.user,
            port=self.port if self.port is not None else base.port,
            identity_file=self.identity_file or base.identity_file,
            known_hosts_file=self.known_hosts_file or base.known_hosts_file,
            config_file=self.config_file or base.config_file,
            options=self.options + base.options,
            connect_timeout=self.connect_timeout
            if self.connect_timeout is not None
            else base.connect_timeout,
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class SlurmStep:
    """How a command reaches a node of a Slurm allocation: as a step of `job`, with `cpus`
    CPUs (the job's on that node). srun gives a task one CPU unless told (22.05 to 23.02 no
    longer read SLURM_CPUS_PER_TASK), which starves a node's ranks and data loaders."""

    job: str
    cpus: int | None = None
    """None: srun's default."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Node:
    """One machine of the cluster."""

    host: str
    """Name as written in the spec: an ssh config alias, a host name or an address."""
    slots: int
    """Ranks (GPUs) to run on this node."""
    gpu_ids: tuple[int, ...]
    """Which local GPU indices the slots map to (DeepSpeed's --include `host:0,2`)."""
    python: str
    """Python interpreter on the node (default: the launching interpreter's path)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment for this node: cluster-wide values overridden by the node's own."""
    interface: str | None = None
    """Network interface for NCCL/gloo traffic, when the user pins it."""
    ssh: SshOptions = field(default_factory=SshOptions)
    """How to reach it."""
    slurm: SlurmStep | None = None
    """The Slurm job whose allocation holds this node: commands reach it as a step of that job
    (`srun --overlap`), not over ssh, which Slurm clusters block or limit to job holders."""

    @property
    def is_local(self) -> bool:
        """True when commands for this node run here directly, without ssh."""
        return (
            self.host in LOCAL_HOSTS
            and self.ssh.user is None
            and self.ssh.port is None
            and self.slurm is None
        )

    @property
    def via_ssh(self) -> bool:
        """True when commands for this node go through ssh (neither here nor through srun)."""
        return not self.is_local and self.slurm is None


@dataclass(kw_only=True, slots=True, frozen=True)
class Cluster:
    """The nodes plus cluster-wide settings. Node order is rank order."""

    nodes: tuple[Node, ...]
    master: str
    """Host of the node that runs rank 0 and the rendezvous store."""
    master_port: int = DEFAULT_MASTER_PORT
    workdir: str | None = None
    """Working directory for jobs on every node (default: the launch directory)."""
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = "<local>"
    """Where the spec came from, for messages."""

    @property
    def world_size(self) -> int:
        return sum(node.slots for node in self.nodes)

    def node(self, host: str) -> Node:
        for node in self.nodes:
            if node.host == host:
                return node
        raise KeyError(host)
