"""The finding ids (`FindingId`) and the shape of a catalog entry; the entries themselves are
in `connectivity.py` (ssh, network) and `node.py` (software, resources, runtime).

    >>> FindingId("slow-link") is FindingId.SLOW_LINK
    True
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FindingId(str, enum.Enum):
    """A catalogued finding id; equal to (and formatted as) its text, e.g. "ssh-unreachable"."""

    SSH_UNREACHABLE = "ssh-unreachable"
    SSH_AUTH_FAILED = "ssh-auth-failed"
    SSH_HOSTKEY_UNKNOWN = "ssh-hostkey-unknown"
    SSH_HOSTKEY_CHANGED = "ssh-hostkey-changed"
    SSH_HOSTKEY_ALGO = "ssh-hostkey-algo"
    PDSH_MISSING = "pdsh-missing"
    REMOTE_PATH_MISSING = "remote-path-missing"
    REMOTE_ENV_DIFFERS = "remote-env-differs"
    LOGIN_SHELL_SLOW = "login-shell-slow"
    SLOW_NODE = "slow-node"

    IFACE_MISMATCH = "iface-mismatch"
    IFACE_WRONG = "iface-wrong"
    HOSTNAME_LOOPBACK = "hostname-loopback"
    HOSTNAME_UNRESOLVABLE = "hostname-unresolvable"
    FIREWALL_BLOCKS_PORTS = "firewall-blocks-ports"
    PORT_IN_USE = "port-in-use"
    MTU_MISMATCH = "mtu-mismatch"
    IPV6_MISMATCH = "ipv6-mismatch"
    SLOW_LINK = "slow-link"
    IB_MEMLOCK = "ib-memlock"
    IB_CONFIG = "ib-config"
    IB_GID_INDEX = "ib-gid-index"

    VERSION_MISMATCH = "version-mismatch"
    TORCH_MISSING = "torch-missing"
    CUDA_HOME_MISSING = "cuda-home-missing"
    NINJA_MISSING = "ninja-missing"
    CODE_DIFFERS = "code-differs"
    SHARED_DIR_MISSING = "shared-dir-missing"
    JIT_LOCK_STALE = "jit-lock-stale"
    ENV_NOT_FORWARDED = "env-not-forwarded"

    GPU_COUNT_MISMATCH = "gpu-count-mismatch"
    GPU_BUSY = "gpu-busy"
    GPU_UNHEALTHY = "gpu-unhealthy"
    NVIDIA_SMI_FAILED = "nvidia-smi-failed"
    GPU_ECC_UNCORRECTED = "gpu-ecc-uncorrected"
    GPU_REMAP_PENDING = "gpu-remap-pending"
    GPU_XID = "gpu-xid"
    GPU_MIG_ENABLED = "gpu-mig-enabled"
    CUDA_DRIVER_TOO_OLD = "cuda-driver-too-old"
    GPU_DRIVER_DIFFERS = "gpu-driver-differs"
    NVLINK_DOWN = "nvlink-down"
    GPU_PCIE_DEGRADED = "gpu-pcie-degraded"
    GPU_THROTTLED = "gpu-throttled"
    GPU_PERSISTENCE_OFF = "gpu-persistence-off"
    SHM_SMALL = "shm-small"
    SHM_BUS_ERROR = "shm-bus-error"
    RAM_INSUFFICIENT = "ram-insufficient"
    DISK_LOW = "disk-low"
    CLOCK_SKEW = "clock-skew"

    RENDEZVOUS_TIMEOUT = "rendezvous-timeout"
    STARTUP_TIMEOUT = "startup-timeout"
    RANK_CRASHED = "rank-crashed"
    RANK_HUNG = "rank-hung"
    RANK_STRAGGLER = "rank-straggler"
    ORPHAN_PROCESSES = "orphan-processes"
    NESTED_LAUNCHER = "nested-launcher"
    OUTPUT_NOT_SHARED = "output-not-shared"

    SLURM_NODE_UNREACHABLE = "slurm-node-unreachable"
    SLURM_TASK_LAYOUT = "slurm-task-layout"
    SLURM_EXPORT_NONE = "slurm-export-none"
    SLURM_GPUS_DIFFER = "slurm-gpus-differ"

    # str(), format() and f-strings give the id itself on every Python (3.11 and later would
    # otherwise print "FindingId.SSH_UNREACHABLE").
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Area(str, enum.Enum):
    """Where a failure lives; one section of docs/findings.md each, in this order."""

    SSH = "ssh"
    NETWORK = "network"
    SOFTWARE = "software"
    RESOURCES = "resources"
    RUNTIME = "runtime"
    SLURM = "slurm"


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How the sandbox (`trainfleet sandbox up`) reproduces a failure, and which cluster-tier
    tests assert its id there."""

    faults: tuple[str, ...] = ()
    """`--fault` names (sandbox/faults.py) that cause it."""
    setup: str = ""
    """Otherwise (or besides), what the test changes in the sandbox."""
    tests: tuple[str, ...] = ()
    """Files under tests/cluster/ that reproduce it and name the id."""


@dataclass(frozen=True, slots=True)
class Entry:
    area: Area
    title: str
    """One line: what is wrong."""
    seen: str
    """What the user sees without trainfleet."""
    detect: str
    """How trainfleet finds it (for a planned entry: what it should do)."""
    fix: str
    sandbox: Sandbox | None = None
    """None: not reproducible in the sandbox (or no cluster test asserts it yet)."""
    planned: bool = False
    """Catalogued, but trainfleet does not report this id yet."""
    fixed_by: str = ""
    """The trainfleet command that fixes it, as typed after `trainfleet` and before the cluster
    options (`setup firewall --apply`, `sync`); empty: none does (the fix says what to do)."""
