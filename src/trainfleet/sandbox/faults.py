"""Faults the sandbox can inject, each reproducing a catalogued finding on one node.

    >>> parse_fault("firewall-blocks-ports@1", ["gpu-node-1", "gpu-node-2"])
    Fault(name='firewall-blocks-ports', node=1)

Written as `NAME[@NODE]`, NODE a 1-based index or a node's hostname; without it, each fault has
the default node named in FAULTS (the master for faults about the master's ports).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfleet.catalog import FindingId
from trainfleet.errors import SandboxError
from trainfleet.sandbox.fakegpu import FakeGpuSpec, FakeProcess, xid_line


@dataclass(frozen=True, slots=True)
class FaultKind:
    pitfall_id: FindingId | None
    """The finding id doctor must report for it (docs/findings.md); None for a hostile node
    (`sandbox/hostile.py`), which tests trainfleet's trust rules rather than a pitfall, and for
    `fake-gpu`, the healthy GPUs the other `fake-gpu-*` faults break."""
    default_node: str
    """'first' (the master) or 'last'."""
    what: str
    gpus: FakeGpuSpec | None = None
    """The node's simulated GPUs (`sandbox/fakegpu.py`): its nvidia-smi and dmesg say so."""

    @property
    def reproduces(self) -> str:
        """What `sandbox up --help` says it reproduces."""
        if self.pitfall_id:
            return self.pitfall_id.value
        return "no finding: the healthy baseline" if self.gpus else "a hostile node: trust rules"


HEALTHY_GPUS = FakeGpuSpec()
"""`fake-gpu`: 8 GPUs that say what the recorded H200 said (sandbox/fakegpu.py)."""
_ALL = range(HEALTHY_GPUS.gpus)
_GPUS: dict[str, tuple[FindingId | None, str, FakeGpuSpec]] = {
    "fake-gpu": (
        None,
        "8 simulated H200s, healthy: their nvidia-smi and dmesg answer as the recorded one",
        HEALTHY_GPUS,
    ),
    "fake-gpu-ecc": (
        FindingId.GPU_ECC_UNCORRECTED,
        "fake-gpu, GPU 3 with 2 uncorrected volatile ECC errors",
        FakeGpuSpec(fields={3: {"ecc.errors.uncorrected.volatile.total": "2"}}),
    ),
    "fake-gpu-remap": (
        FindingId.GPU_REMAP_PENDING,
        "fake-gpu, GPU 5 with a row remapping pending",
        FakeGpuSpec(remapped={5: {"remapped_rows.pending": "Yes"}}),
    ),
    "fake-gpu-xid": (
        FindingId.GPU_XID,
        "fake-gpu, dmesg has an Xid 79 (fallen off the bus) for GPU 2",
        FakeGpuSpec(xid=(xid_line(2, 79, 48213, "python3", "GPU has fallen off the bus."),)),
    ),
    "fake-gpu-mig": (
        FindingId.GPU_MIG_ENABLED,
        "fake-gpu, GPU 0 in MIG mode",
        FakeGpuSpec(fields={0: {"mig.mode.current": "Enabled", "mig.mode.pending": "Enabled"}}),
    ),
    "fake-gpu-old-driver": (
        FindingId.CUDA_DRIVER_TOO_OLD,
        "fake-gpu on driver 470.256.02 (CUDA 11.4, old clock reason names), its torch "
        "metadata claiming a CUDA 13.0 build (2.11.0+cu130)",
        FakeGpuSpec(driver="470.256.02", cuda="11.4", old_clock_names=True, torch="2.11.0+cu130"),
    ),
    "fake-gpu-nvlink": (
        FindingId.NVLINK_DOWN,
        "fake-gpu with 18 NVLinks per GPU, GPU 6's link 3 inactive",
        FakeGpuSpec(nvlinks=18, inactive_links=((6, 3),)),
    ),
    "fake-gpu-pcie": (
        FindingId.GPU_PCIE_DEGRADED,
        "fake-gpu, GPU 2's PCIe link x8 of x16",
        FakeGpuSpec(fields={2: {"pcie.link.width.current": "8"}}),
    ),
    "fake-gpu-throttled": (
        FindingId.GPU_THROTTLED,
        "fake-gpu, GPU 1 held down by HW thermal slowdown",
        # NVML's reason bits: 0x1 idle (recorded), 0x8 HW slowdown, 0x40 its thermal subset.
        FakeGpuSpec(
            fields={
                1: {
                    "clocks_event_reasons.active": "0x0000000000000049",
                    "clocks_event_reasons.hw_slowdown": "Active",
                    "clocks_event_reasons.hw_thermal_slowdown": "Active",
                }
            }
        ),
    ),
    "fake-gpu-persistence": (
        FindingId.GPU_PERSISTENCE_OFF,
        "fake-gpu, persistence mode off on every GPU",
        FakeGpuSpec(fields={gpu: {"persistence_mode": "Disabled"} for gpu in _ALL}),
    ),
    "fake-gpu-count": (
        FindingId.GPU_COUNT_MISMATCH,
        "fake-gpu with 7 GPUs (found where the node has 8 slots)",
        FakeGpuSpec(gpus=7),
    ),
    "fake-gpu-busy": (
        FindingId.GPU_BUSY,
        "fake-gpu, a process holds 30000 MiB on GPU 0",
        FakeGpuSpec(
            fields={0: {"memory.used": "30000"}},
            processes=(FakeProcess(pid=48213, name="python3", used_mib=30000, gpu=0),),
        ),
    ),
    "fake-gpu-no-driver": (
        FindingId.NVIDIA_SMI_FAILED,
        "fake-gpu's nvidia-smi fails: the driver is not loaded",
        FakeGpuSpec(driver_loaded=False),
    ),
}
"""The simulated-GPU faults: `fake-gpu` and one variant per GPU finding, each changing only
what it names."""


FAULTS: dict[str, FaultKind] = {
    "firewall-blocks-ports": FaultKind(
        FindingId.FIREWALL_BLOCKS_PORTS,
        "first",
        "iptables passes ssh and the master port, drops every other new TCP connection",
    ),
    "firewall-ssh-only": FaultKind(
        FindingId.FIREWALL_BLOCKS_PORTS,
        "last",
        "iptables drops every new TCP connection except ssh",
    ),
    "hostname-loopback": FaultKind(
        FindingId.HOSTNAME_LOOPBACK,
        "last",
        "the node's own name resolves to 127.0.1.1 (Debian style)",
    ),
    "port-in-use": FaultKind(
        FindingId.PORT_IN_USE, "first", "a leftover process listens on the master port"
    ),
    "ssh-auth-failed": FaultKind(
        FindingId.SSH_AUTH_FAILED, "last", "sshd trusts no key (no passwordless login to the node)"
    ),
    "ssh-hostkey-changed": FaultKind(
        FindingId.SSH_HOSTKEY_CHANGED, "last", "known_hosts holds another key than the node's"
    ),
    "ssh-hostkey-type-changed": FaultKind(
        FindingId.SSH_HOSTKEY_CHANGED,
        "last",
        "sshd offers only an ECDSA key where known_hosts holds an Ed25519 one (a man in the "
        "middle that offers another key type)",
    ),
    "ssh-hostkey-unknown": FaultKind(
        FindingId.SSH_HOSTKEY_UNKNOWN, "last", "known_hosts has no entry for the node"
    ),
    "slow-link": FaultKind(
        FindingId.SLOW_LINK, "last", "the node's link is shaped to 50 Mbit/s (tc tbf)"
    ),
    "cpu-throttle": FaultKind(
        FindingId.RANK_STRAGGLER,
        "last",
        "the node's processes together get 75% of one CPU (a cgroup quota): its rank straggles",
    ),
    "mtu-mismatch": FaultKind(FindingId.MTU_MISMATCH, "last", "the node's interface has MTU 1280"),
    "node-down": FaultKind(
        FindingId.SSH_UNREACHABLE, "last", "the node's link is down and it runs no sshd"
    ),
    "decoy-iface": FaultKind(
        FindingId.IFACE_WRONG,
        "last",
        "`virbr0` and `docker0` with unrelated addresses, ahead of the data interface",
    ),
    "hostname-unresolvable": FaultKind(
        FindingId.HOSTNAME_UNRESOLVABLE,
        "last",
        "the node's own name is missing from its /etc/hosts",
    ),
    "client-name-unresolvable": FaultKind(
        FindingId.HOSTNAME_UNRESOLVABLE,
        "first",
        "the master's /etc/hosts names no IPv4-mapped address (c10d's `err=-3` on every rank)",
    ),
    "dns-unreachable": FaultKind(
        FindingId.HOSTNAME_UNRESOLVABLE,
        "first",
        "the node's resolver (127.0.0.53) never answers, as on air-gapped clusters, and its "
        "/etc/hosts names no IPv4-mapped address: a reverse lookup waits glibc's 5 s x 2 tries",
    ),
    "slow-login": FaultKind(
        FindingId.SLOW_NODE,
        "last",
        "root's login shell on the node waits SLOW_LOGIN_S before it runs anything (a startup "
        "file that waits: conda or pyenv init, a network home)",
    ),
    "hostname-impostor": FaultKind(
        None, "last", "`hostname` on the node answers another node's name (root there sets any)"
    ),
    "planted-modules": FaultKind(
        None,
        "last",
        "the node's home, where its ssh sessions start, holds base64.py, json.py, pip.py, ... "
        "(a home on storage other nodes write)",
    ),
    "torch-import-error": FaultKind(
        FindingId.TORCH_MISSING,
        "last",
        "`import torch` fails on the node with terminal escape sequences in its error text",
    ),
    "remote-env-differs": FaultKind(
        FindingId.REMOTE_ENV_DIFFERS,
        "last",
        "non-interactive ssh gets PATH=/usr/bin:/bin:/usr/sbin:/sbin and no ~/.bashrc",
    ),
    **{
        name: FaultKind(pitfall, "last", what, gpus)
        for name, (pitfall, what, gpus) in _GPUS.items()
    },
}

SLOW_LINK_RATE = "50mbit"
DECOYS = {"virbr0": "192.168.122.1/24", "docker0": "172.17.0.1/16"}
"""libvirt's and docker's bridges: NCCL skips docker* by default but not virbr*."""
BARE_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
SLOW_LOGIN_S = 12
SILENT_RESOLVER = "127.0.0.53"
"""Where a `dns-unreachable` node's resolv.conf points: a UDP socket there takes the queries
and never answers (as a stub resolver whose upstream is unreachable)."""
SMALL_MTU = 1280


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    node: int
    """1-based node index."""

    @property
    def kind(self) -> FaultKind:
        return FAULTS[self.name]

    def __str__(self) -> str:
        return f"{self.name}@{self.node}"


def parse_fault(text: str, hostnames: list[str]) -> Fault:
    name, _, where = text.partition("@")
    if name not in FAULTS:
        raise SandboxError(f"unknown fault {name!r}", f"known faults: {', '.join(FAULTS)}")
    if not where:
        index = 1 if FAULTS[name].default_node == "first" else len(hostnames)
    elif where.isdigit():
        index = int(where)
    elif where in hostnames:
        index = hostnames.index(where) + 1
    else:
        raise SandboxError(
            f"fault {text!r} names no node", f"use 1..{len(hostnames)} or one of {hostnames}"
        )
    if not 1 <= index <= len(hostnames):
        raise SandboxError(
            f"fault {text!r}: node {index} does not exist", f"use 1..{len(hostnames)}"
        )
    return Fault(name, index)


def firewall_rules(name: str, master_port: int) -> list[list[str]]:
    """iptables argv lists (without the `iptables` itself) for a firewall fault."""
    allowed = ["22"] if name == "firewall-ssh-only" else ["22", str(master_port)]
    rules = [
        ["-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
        ["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ]
    rules += [["-A", "INPUT", "-p", "tcp", "--dport", port, "-j", "ACCEPT"] for port in allowed]
    rules.append(["-A", "INPUT", "-p", "tcp", "--syn", "-j", "DROP"])
    return rules
