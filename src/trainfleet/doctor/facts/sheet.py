"""The types of a fact sheet: what a node reports, as frozen values (built by `parse.py`).

>>> Disk(total=None, free=None).total is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainfleet.node.probe import PROBE_VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """`getaddrinfo(name)` on the node: its addresses, or the error."""

    addresses: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Interface:
    """One network interface, as `ip -j addr` lists it (addresses as CIDR strings)."""

    name: str
    state: str | None = None
    up: bool = False
    mtu: int | None = None
    link_type: str | None = None
    bridge: bool = False
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """`ip route get MASTER_ADDR` on the node."""

    dev: str | None = None
    src: str | None = None
    gateway: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientName:
    """The master's reverse lookup of a client's IPv4-mapped address (c10d's store)."""

    name: str | None = None
    error: str | None = None
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolver:
    """The node's DNS resolver settings (/etc/resolv.conf, RES_OPTIONS)."""

    nameservers: tuple[str, ...] = ()
    timeout: int | None = None
    attempts: int | None = None

    @property
    def unanswered_s(self) -> float | None:
        """How long glibc waits on a query that no nameserver answers: each try goes to every
        server in turn (timeout 1..30 s, tries up to 5, as glibc clamps them)."""
        if self.timeout is None or self.attempts is None or not self.nameservers:
            return None
        return max(1, min(self.timeout, 30)) * min(self.attempts, 5) * len(self.nameservers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """A listening TCP socket; pid and command only for the ports the probe was asked about."""

    addr: str | None = None
    port: int | None = None
    pid: int | None = None
    cmd: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandOutput:
    """A firewall tool's answer: exit status and (tail of) its output."""

    rc: int | None = None
    out: str = ""
    err: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Firewall:
    """Each firewall tool found on the node (None: not installed, or unknown)."""

    iptables: CommandOutput | None = None
    nft: CommandOutput | None = None
    ufw: CommandOutput | None = None
    firewalld: CommandOutput | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Soft rlimits of the probe's process; None: unlimited (or unknown)."""

    memlock: int | None = None
    nofile: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disk:
    """statvfs of a path, in bytes."""

    total: int | None = None
    free: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """/proc/meminfo, in bytes."""

    total: int | None = None
    available: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Workdir:
    path: str | None = None
    exists: bool | None = None
    disk: Disk = field(default_factory=Disk)


@dataclass(frozen=True, slots=True, kw_only=True)
class Python:
    executable: str | None = None
    version: str | None = None
    """"3.11.4"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Packages:
    """Installed versions from the dist-info metadata (no imports); None: not installed."""

    torch: str | None = None
    deepspeed: str | None = None
    transformers: str | None = None
    accelerate: str | None = None
    datasets: str | None = None
    peft: str | None = None
    nccl_wheel: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Imports:
    """What importing torch in the node's python reported (doctor's stack phase,
    `node/collective.py`, full mode only)."""

    torch: str | None = None
    torch_cuda: str | None = None
    nccl: str | None = None
    torch_distributed: bool | None = None
    gloo: bool | None = None
    torch_error: str | None = None
    import_error: str | None = None
    """The stack phase's process failed before it reported (its last error line), or hung."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One GPU as the node's nvidia-smi reports it (`node/gpus.py`); None: not reported, or
    reported as `[N/A]`/`[Not Supported]`/something unreadable."""

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    bus_id: str | None = None
    """nvidia-smi's pci.bus_id, e.g. "00000000:3B:00.0"."""
    memory_mib: int | None = None
    used_mib: int | None = None
    driver: str | None = None
    persistence: bool | None = None
    mig: bool | None = None
    ecc: bool | None = None
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile)."""
    retired_pending: bool | None = None
    """Pages waiting to be retired (before Ampere; Hopper reports [N/A] and remaps rows)."""
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    slowdowns: tuple[str, ...] = ()
    """The active clock event reasons that are faults: hw_slowdown, hw_thermal_slowdown,
    hw_power_brake_slowdown, sw_thermal_slowdown (idle and application clocks are not)."""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    temperature_c: int | None = None
    nvlinks_up: int = 0
    nvlinks_down: tuple[int, ...] = ()
    """Link numbers `nvidia-smi nvlink --status` lists without a speed."""

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.bus_id})" if self.bus_id else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    """A compute process on a GPU, as nvidia-smi's CSV gives it (text fields)."""

    pid: str | None = None
    name: str | None = None
    used_mib: str | None = None
    gpu: str | None = None
    """The GPU's UUID."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Xid:
    """An `NVRM: Xid (PCI:...): CODE, ...` kernel line: the GPU's bus, the code, the line."""

    bus_id: str
    code: int
    line: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpus:
    devices: tuple[Gpu, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None
    """nvidia-smi is there but failed (its exit code and message)."""
    query: str | None = None
    """Which field set answered: health, legacy (an older driver's names), basic."""
    cuda_version: str | None = None
    """The newest CUDA the driver supports."""
    remapped_known: bool = False
    """Whether nvidia-smi answered the remapped-rows query (not before Ampere)."""
    xid: tuple[Xid, ...] = ()
    kernel_log: str | None = None
    """Where the Xids were read (dmesg, journalctl); None: not readable (kernel_log_error)."""
    kernel_log_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JitLock:
    """A torch JIT build lock: its path, age and the pids that hold it or work beside it."""

    path: str
    age_s: float
    busy_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeHash:
    sha256: str | None = None
    files: int | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SshOutcome:
    """This node's `ssh -N` to a peer: rc 0 once authenticated, 124 when the probe stopped it."""

    rc: int
    stderr: str = ""
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """Bytes a peer streamed to this node's listener, and over how many seconds."""

    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Active:
    """The tests whose other end is the other nodes' probes."""

    tcp: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """peer -> port -> "open", "refused", "timeout", "no-route" or "error: ..."."""
    tcp_last_attempt: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    ssh: Mapping[str, SshOutcome] = field(default_factory=dict)
    listen: Mapping[str, str] = field(default_factory=dict)
    """port -> "listening" or "bind failed: ..."."""
    listen_since: float | None = None
    listen_until: float | None = None
    token: str | None = None
    """"written", "not written: ..."; None when none was asked for."""
    shared: Mapping[str, bool] = field(default_factory=dict)
    """peer -> whether its token is seen in this node's workdir (shared storage)."""
    bandwidth_send: str | None = None
    bandwidth_in: Mapping[str, Transfer] = field(default_factory=dict)
    go_wait: float | None = None
    """Seconds the probe waited for every peer to start before its tests (`doctor/pace.py`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFacts:
    """One node's fact sheet. Every field may be unknown (None, empty): checks judge only what
    the node reported."""

    probe_version: int = PROBE_VERSION
    node: str | None = None
    pid: int | None = None
    time: float | None = None
    """The node's clock when the probe ran."""
    seconds: float | None = None
    """How long the probe took."""
    hostname: str | None = None
    fqdn: str | None = None
    resolve: Mapping[str, Resolution] = field(default_factory=dict)
    """The node's own name and the master's name, as the node resolves them."""
    interfaces: tuple[Interface, ...] | None = None
    """None: the probe could not list them."""
    route_to_master: Route | None = None
    client_names: Mapping[str, ClientName] = field(default_factory=dict)
    resolver: Resolver = field(default_factory=Resolver)
    listening: tuple[Listener, ...] = ()
    firewall: Firewall = field(default_factory=Firewall)
    ipv6_disabled: str | None = None
    port_range: str | None = None
    limits: Limits = field(default_factory=Limits)
    shm: Disk = field(default_factory=Disk)
    memory: Memory = field(default_factory=Memory)
    workdir: Workdir = field(default_factory=Workdir)
    python: Python = field(default_factory=Python)
    packages: Packages = field(default_factory=Packages)
    imports: Imports | None = None
    """None: not imported (quick probe) or unknown."""
    tools: Mapping[str, str | None] = field(default_factory=dict)
    """Tool -> its path on the non-interactive PATH, None when missing there."""
    path: str = ""
    """The non-interactive PATH."""
    cuda_home: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """The node's NCCL_*, GLOO_*, MASTER_*, ... variables."""
    gpus: Gpus | None = None
    """None: no nvidia-smi."""
    infiniband: tuple[str, ...] = ()
    """InfiniBand device names."""
    jit_locks: tuple[JitLock, ...] = ()
    code: CodeHash | None = None
    active: Active = field(default_factory=Active)
