"""Every finding id trainfleet reports, with what it means: the one registry of ids.

    >>> FindingId.SSH_UNREACHABLE == "ssh-unreachable"
    True
    >>> f"{FindingId.PORT_IN_USE}: 29500 is taken"
    'port-in-use: 29500 is taken'
    >>> CATALOG[FindingId.SLOW_LINK].area
    <Area.NETWORK: 'network'>
    >>> CATALOG[FindingId.SLOW_LINK].sandbox.faults
    ('slow-link',)

An id is a `str` (doctor's `--json`, restart causes and tests see the same text), and each is
a member of `FindingId`, so that code names ids by attribute and a misspelt one fails at
import. `Finding` (doctor/findings.py) turns the id it is given into a member and refuses
one that is not catalogued. `CATALOG` holds each id's entry: its area, what a user sees
without trainfleet, how trainfleet finds it, the fix, and how the sandbox reproduces it.
Entries marked `planned` are known failures that trainfleet does not report yet.

docs/findings.md is generated from here: `python -m trainfleet.catalog --markdown >
docs/findings.md` (a unit test keeps the two equal).
"""

from __future__ import annotations

import argparse
import enum
import sys
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
    SHM_SMALL = "shm-small"
    SHM_BUS_ERROR = "shm-bus-error"
    RAM_INSUFFICIENT = "ram-insufficient"
    DISK_LOW = "disk-low"
    CLOCK_SKEW = "clock-skew"

    RENDEZVOUS_TIMEOUT = "rendezvous-timeout"
    STARTUP_TIMEOUT = "startup-timeout"
    RANK_CRASHED = "rank-crashed"
    RANK_HUNG = "rank-hung"
    ORPHAN_PROCESSES = "orphan-processes"
    NESTED_LAUNCHER = "nested-launcher"
    OUTPUT_NOT_SHARED = "output-not-shared"

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


_SSH, _NET, _SW, _RES, _RUN = Area.SSH, Area.NETWORK, Area.SOFTWARE, Area.RESOURCES, Area.RUNTIME
_DOCTOR = ("test_doctor.py",)

CATALOG: dict[FindingId, Entry] = {
    # ------------------------------------------------------------------ ssh
    FindingId.SSH_UNREACHABLE: Entry(
        area=_SSH,
        title="a node does not answer on its ssh port",
        seen="the launcher waits, then `ssh: connect to host ... Connection timed out` (or "
        "refused)",
        detect="ssh with a short ConnectTimeout from this machine and from every node; ssh's "
        "stderr tells refused, timed out, no route and a probe that never finished apart",
        fix="check the node's address, that it is up, that sshd runs and that port 22 is open",
        sandbox=Sandbox(faults=("node-down",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
    ),
    FindingId.SSH_AUTH_FAILED: Entry(
        area=_SSH,
        title="no passwordless login to a node",
        seen="`Permission denied (publickey,password)`, pdsh exit 255, or a password prompt",
        detect="`ssh -o BatchMode=yes` from this machine to every node and from every node to "
        "every node, itself included",
        fix="`trainfleet setup ssh`, or `ssh-copy-id` for the pair named",
        sandbox=Sandbox(faults=("ssh-auth-failed",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
    ),
    FindingId.SSH_HOSTKEY_UNKNOWN: Entry(
        area=_SSH,
        title="known_hosts has no key for a node",
        seen="`The authenticity of host ... can't be established`, which blocks every "
        "non-interactive run",
        detect="the same ssh with StrictHostKeyChecking=yes; ssh's stderr",
        fix="compare the fingerprints, then add the key (`doctor --fix` does both); never "
        "`StrictHostKeyChecking=no`",
        sandbox=Sandbox(faults=("ssh-hostkey-unknown",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
    ),
    FindingId.SSH_HOSTKEY_CHANGED: Entry(
        area=_SSH,
        title="a node's host key differs from the one in known_hosts",
        seen="`REMOTE HOST IDENTIFICATION HAS CHANGED`",
        detect="the same ssh; ssh's stderr",
        fix="once the new fingerprint is confirmed, `ssh-keygen -R HOST` (never done for you)",
        sandbox=Sandbox(
            faults=("ssh-hostkey-changed",),
            tests=(*_DOCTOR, "test_sandbox_exec.py", "test_setup.py"),
        ),
    ),
    FindingId.SSH_HOSTKEY_ALGO: Entry(
        area=_SSH,
        title="client and node share no host key algorithm",
        seen="`no matching host key type found. Their offer: ssh-rsa`",
        detect="the same ssh; ssh's stderr",
        fix="`HostKeyAlgorithms +ssh-rsa` for that host in ~/.ssh/config, or new host keys",
    ),
    FindingId.PDSH_MISSING: Entry(
        area=_SSH,
        title="DeepSpeed's runner has no pdsh on this machine",
        seen="`launcher 'pdsh' not installed`, or `rcmd: socket: Permission denied` when "
        "pdsh uses rsh",
        detect="pdsh on this machine's PATH, for clusters of two or more nodes (INFO)",
        fix="install pdsh (with `PDSH_RCMD_TYPE=ssh`), or launch with trainfleet's ssh backend",
    ),
    FindingId.REMOTE_PATH_MISSING: Entry(
        area=_SSH,
        title="the working directory or the node's python is missing there",
        seen="`cd: ...: No such file or directory`, `.../bin/python: No such file or directory`",
        detect="the probe runs with the node's configured python in the working directory",
        fix="the same layout (or shared storage) on every node, or per-node `python:` / "
        "`workdir:` in cluster.yaml",
        sandbox=Sandbox(
            setup="a node's `python:` or the `workdir:` set to a path that does not exist",
            tests=_DOCTOR,
        ),
    ),
    FindingId.REMOTE_ENV_DIFFERS: Entry(
        area=_SSH,
        title="the non-interactive environment lacks what a login shell has",
        seen="`deepspeed: command not found` or `Ninja is required to load C++ extensions` on "
        "remote nodes only; conda not active over ssh",
        detect="torchrun, deepspeed, ninja and nvcc and the PATH directories on each node's "
        "non-interactive PATH, compared with the other nodes and this machine",
        fix="activate the environment for non-interactive ssh, or `trainfleet setup env` (PATH "
        "per node in cluster.yaml)",
        sandbox=Sandbox(faults=("remote-env-differs",), tests=(*_DOCTOR, "test_sandbox_faults.py")),
    ),
    FindingId.LOGIN_SHELL_SLOW: Entry(
        area=_SSH,
        title="every ssh session takes seconds",
        seen="probes and launches crawl or time out (a heavy ~/.bashrc, a stale `pyenv rehash` "
        "lock)",
        detect="time the non-interactive login on each node; name the file and the seconds",
        fix="make the slow startup file return early for non-interactive shells",
        planned=True,
    ),
    # ------------------------------------------------------------------ network
    FindingId.IFACE_MISMATCH: Entry(
        area=_NET,
        title="one interface variable for nodes whose interfaces are named differently",
        seen="`Unable to find address for: ens14f1`, `no socket interface found`",
        detect="NCCL's rules (prefix, `^`, `=`) and gloo's (exact names, the same count on "
        "every node) applied to each node's interfaces; launch reports a global value that "
        "misses a node and sets that node's own",
        fix="`interface:` per node in cluster.yaml (`doctor --fix` writes it), or a prefix list "
        "that covers every node",
        sandbox=Sandbox(
            faults=("decoy-iface",),
            setup="differently named interfaces (`--ifnames`) and one GLOO/NCCL_SOCKET_IFNAME",
            tests=_DOCTOR,
        ),
    ),
    FindingId.IFACE_WRONG: Entry(
        area=_NET,
        title="NCCL or gloo would pick an interface that does not reach the master",
        seen="with the variables unset, NCCL takes virbr0, a veth or another subnet, then hangs",
        detect="NCCL's default order emulated per node against the interface that routes to "
        "the master; virtual interfaces on the route; a pinned interface off the route",
        fix="NCCL_SOCKET_IFNAME per node: the interface that routes to the master",
        sandbox=Sandbox(faults=("decoy-iface",), tests=_DOCTOR),
    ),
    FindingId.HOSTNAME_LOOPBACK: Entry(
        area=_NET,
        title="a node's own name resolves to loopback",
        seen="gloo binds 127.0.1.1; peers get `connect [127.0.1.1]: Connection refused`",
        detect="the node's own name resolved on the node",
        fix="set the interface variables (launch does), or map the name to the node's address "
        "in /etc/hosts",
        sandbox=Sandbox(
            faults=("hostname-loopback",),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.HOSTNAME_UNRESOLVABLE: Entry(
        area=_NET,
        title="a name the job needs does not resolve",
        seen="`Name or service not known`, `hostname of the client socket cannot be retrieved`",
        detect="each node resolves its own name and the master's; the master names its "
        "clients' IPv4-mapped addresses; ssh's `Could not resolve hostname`",
        fix="/etc/hosts entries (the finding gives the lines), or addresses instead of names",
        sandbox=Sandbox(
            faults=("hostname-unresolvable", "client-name-unresolvable"),
            tests=(*_DOCTOR, "test_sandbox_faults.py"),
        ),
    ),
    FindingId.FIREWALL_BLOCKS_PORTS: Entry(
        area=_NET,
        title="a firewall drops TCP between nodes on the ports NCCL and gloo pick",
        seen="ssh and the master port work, then init hangs for 10-30 min and ends in "
        "`timed out connecting`",
        detect="every node connects to listeners on every other node: the master port and "
        "random ephemeral ports; the node's iptables, nftables, ufw or firewalld state",
        fix="allow TCP from the cluster's subnet on the data interface (the exact rule is "
        "printed; `trainfleet setup firewall` adds it); never disable the firewall",
        sandbox=Sandbox(
            faults=("firewall-blocks-ports", "firewall-ssh-only"),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py", "test_setup.py"),
        ),
    ),
    FindingId.PORT_IN_USE: Entry(
        area=_NET,
        title="the master port is taken",
        seen="`errno: 98 - Address already in use` on 29500",
        detect="a bind test and the listening sockets on the master, with the owner's pid and "
        "command",
        fix="stop the leftover process, or another master port (launch picks a free one)",
        sandbox=Sandbox(
            faults=("port-in-use",),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.MTU_MISMATCH: Entry(
        area=_NET,
        title="the cluster interfaces' MTUs differ",
        seen="small collectives pass, large ones hang",
        detect="the MTU of each node's chosen interface, compared across nodes",
        fix="the same MTU end to end (nodes and switch)",
        sandbox=Sandbox(faults=("mtu-mismatch",), tests=(*_DOCTOR, "test_sandbox_faults.py")),
    ),
    FindingId.IPV6_MISMATCH: Entry(
        area=_NET,
        title="the master's name resolves to IPv6 only on some nodes",
        seen="`errno: 97 - Address family not supported`",
        detect="how each node resolves the master's name",
        fix="the master's IPv4 address as MASTER_ADDR, `NCCL_SOCKET_FAMILY=AF_INET`",
    ),
    FindingId.SLOW_LINK: Entry(
        area=_NET,
        title="one node or link is much slower than the others",
        seen="training runs, but one node drags every step",
        detect="doctor: a short stream from each node to the next, against the median; "
        "commtest: every pair of nodes, send/recv and raw TCP",
        fix="check that node's link: speed and duplex, cabling, traffic shaping",
        sandbox=Sandbox(
            faults=("slow-link",),
            tests=(*_DOCTOR, "test_commtest.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.IB_MEMLOCK: Entry(
        area=_NET,
        title="locked memory is limited on a node with InfiniBand",
        seen="`ibv_reg_mr ... Cannot allocate memory`",
        detect="`ulimit -l` on the non-interactive path where InfiniBand devices exist",
        fix="`memlock unlimited` in limits.conf, or `--ulimit memlock=-1` for containers",
    ),
    FindingId.IB_CONFIG: Entry(
        area=_NET,
        title="InfiniBand/RoCE ports or NCCL's IB settings do not match the devices",
        seen="`Got completion from peer ... error 12`",
        detect="port state, link layer and GID index per node; NCCL_IB_HCA against the devices",
        fix="per-node NCCL_IB_HCA and NCCL_IB_GID_INDEX",
        planned=True,
    ),
    FindingId.IB_GID_INDEX: Entry(
        area=_NET,
        title="RoCE needs a GID index that carries IPv4 on the data subnet",
        seen="four or more nodes hang at the first barrier until NCCL_IB_GID_INDEX, "
        "NCCL_IB_TC or NCCL_IB_HCA are set",
        detect="each node's RoCE GID table: the index with an IPv4 address on the data subnet",
        fix="NCCL_IB_GID_INDEX per node",
        planned=True,
    ),
    # ------------------------------------------------------------------ software
    FindingId.VERSION_MISMATCH: Entry(
        area=_SW,
        title="python, torch, NCCL or DeepSpeed versions differ across nodes",
        seen="deadlocks or cryptic errors in the first collective",
        detect="versions from each node's configured python (an import, else package "
        "metadata); transformers and accelerate only warn",
        fix="the same environment on every node",
    ),
    FindingId.TORCH_MISSING: Entry(
        area=_SW,
        title="torch cannot be imported on a node",
        seen="`ImportError` on one node only",
        detect="`import torch` in a subprocess with a timeout, with each node's python",
        fix="install torch there, or point the node's `python:` at the environment that has it",
        sandbox=Sandbox(
            setup="a node's `python:` set to an interpreter without torch", tests=_DOCTOR
        ),
    ),
    FindingId.CUDA_HOME_MISSING: Entry(
        area=_SW,
        title="a GPU node has neither CUDA_HOME nor nvcc for DeepSpeed's op builds",
        seen="`CUDA_HOME does not exist` when DeepSpeed builds an op",
        detect="CUDA_HOME and nvcc on the non-interactive path of nodes with GPUs",
        fix="CUDA_HOME for that node in cluster.yaml `env:`",
    ),
    FindingId.NINJA_MISSING: Entry(
        area=_SW,
        title="ninja is not on the PATH the ranks get",
        seen="`RuntimeError: Ninja is required to load C++ extensions`",
        detect="ninja on the non-interactive PATH of nodes with DeepSpeed; the same text in a "
        "rank's error",
        fix="`pip install ninja` into that node's python, or its PATH per node",
    ),
    FindingId.CODE_DIFFERS: Entry(
        area=_SW,
        title="the code in the working directory differs between nodes",
        seen="a hang, or `Detected mismatch between collectives`",
        detect="a hash of the working directory on each node",
        fix="the same code everywhere (`trainfleet sync`), or shared storage",
        sandbox=Sandbox(
            setup="node-local working directories (`--node-local-dir`), one node's copy edited",
            tests=(*_DOCTOR, "test_setup.py"),
        ),
    ),
    FindingId.SHARED_DIR_MISSING: Entry(
        area=_SW,
        title="the nodes do not share the working directory",
        seen="checkpoints or data missing on the other nodes",
        detect="a token file each node writes in the working directory, looked for by the "
        "others (INFO)",
        fix="shared storage, or copies of code and data on every node",
        sandbox=Sandbox(
            setup="node-local working directories (`--node-local-dir`)",
            tests=(*_DOCTOR, "test_setup.py"),
        ),
    ),
    FindingId.JIT_LOCK_STALE: Entry(
        area=_SW,
        title="a torch JIT build lock left by a killed build",
        seen="every rank that loads the op waits in silence, forever, right after the rendezvous",
        detect="lock files under the node's torch extensions directory older than a minute "
        "that no process holds or builds under; the shim names a lock a rank waits for",
        fix="`trainfleet doctor --fix` removes it after checking again, or `rm` the lock named",
        sandbox=Sandbox(
            setup="a lock in a node's TORCH_EXTENSIONS_DIR, held by a process then killed",
            tests=_DOCTOR,
        ),
    ),
    FindingId.ENV_NOT_FORWARDED: Entry(
        area=_SW,
        title="a variable set in the launching shell does not reach the other nodes",
        seen="NCCL_DEBUG or NCCL_IB_HCA work on the launch node only; a global interface "
        "variable reaches nodes where it is wrong",
        detect="show per rank where each variable came from (`--dry-run`); forward DeepSpeed's "
        "prefixes; keep interface variables per node",
        fix="cluster.yaml `env:` (per node where values differ)",
        planned=True,
    ),
    # ------------------------------------------------------------------ resources
    FindingId.GPU_COUNT_MISMATCH: Entry(
        area=_RES,
        title="a node has fewer GPUs than its slots",
        seen="`invalid device ordinal`, `No slot 2 specified on host`",
        detect="the GPUs found on each node against its slots; the same text in a rank's error",
        fix="the node's real GPU count as its slots",
    ),
    FindingId.GPU_BUSY: Entry(
        area=_RES,
        title="other processes hold a node's GPUs",
        seen="out of memory at start",
        detect="`nvidia-smi --query-compute-apps` on each node; the busy-device text in a "
        "rank's error",
        fix="stop the processes named (pid and command)",
    ),
    FindingId.GPU_UNHEALTHY: Entry(
        area=_RES,
        title="a GPU with ECC errors, pending row remaps, XIDs or throttled clocks",
        seen="one node slows or crashes the job",
        detect="`nvidia-smi -q` ECC, remapped rows and clock event reasons; XIDs in the kernel log",
        fix="drain the node and have the GPU checked",
        planned=True,
    ),
    FindingId.SHM_SMALL: Entry(
        area=_RES,
        title="/dev/shm is under 1 GiB",
        seen="`unhandled system error`, NCCL shared-memory failures in containers",
        detect="the size of /dev/shm on each node",
        fix="`--shm-size` for the container, or remount /dev/shm larger",
    ),
    FindingId.SHM_BUS_ERROR: Entry(
        area=_RES,
        title="/dev/shm too small for the data loader workers",
        seen="`Bus error` (exit -7) in data loader workers or NCCL, in containers",
        detect="/dev/shm size and free space per node against workers x batch size",
        fix="a larger /dev/shm, or fewer workers",
        planned=True,
    ),
    FindingId.RAM_INSUFFICIENT: Entry(
        area=_RES,
        title="the ranks of a node need more host RAM than it has",
        seen="a host OOM kill (exit -9) that grows with the GPUs per node",
        detect="`trainfleet train`'s preflight: the planner's host RAM per node (loading, "
        "offloaded states) against MemAvailable",
        fix="zero.Init / low-memory loading, fewer ranks per node, or the planner's config "
        "that fits",
    ),
    FindingId.DISK_LOW: Entry(
        area=_RES,
        title="little free space where the job writes",
        seen="`No space left on device` at the first checkpoint",
        detect="free space at the working directory on each node; train's check before each "
        "checkpoint; ENOSPC in a rank's error (a restart cause)",
        fix="another output directory, or fewer kept checkpoints",
        sandbox=Sandbox(
            setup="OUTPUT on a tmpfs shrunk below the next checkpoint", tests=("test_chaos.py",)
        ),
    ),
    FindingId.CLOCK_SKEW: Entry(
        area=_RES,
        title="a node's clock is off",
        seen="logs from different nodes cannot be put in order",
        detect="each node's clock against this machine's while the probe runs",
        fix="NTP (chrony, systemd-timesyncd) on every node",
    ),
    # ------------------------------------------------------------------ runtime
    FindingId.RENDEZVOUS_TIMEOUT: Entry(
        area=_RUN,
        title="ranks did not all join the rendezvous",
        seen="stuck at init for 10-30 minutes without a word",
        detect="the join watchdog (--join-timeout) names the ranks that did not join and runs "
        "doctor on them; doctor's real gloo all_reduce when no cause is known",
        fix="the findings doctor then names (firewall, interfaces, names)",
    ),
    FindingId.STARTUP_TIMEOUT: Entry(
        area=_RUN,
        title="work before the first step outlasts the process group's timeout",
        seen="users raise the timeout to years (`ddp_timeout: 180000000`), which switches "
        "hang detection off",
        detect="judge startup by its own bound and progress, training by the hang timeout",
        fix="a bound for startup of its own, not a longer process-group timeout",
        planned=True,
    ),
    FindingId.RANK_CRASHED: Entry(
        area=_RUN,
        title="a rank died",
        seen="the other nodes hang until the NCCL timeout (10 min)",
        detect="fail-fast: every rank on every node is stopped within seconds; the first real "
        "error across nodes is reported, with a known fix where there is one",
        fix="the root cause printed (its node, rank and error line)",
        sandbox=Sandbox(
            setup="a rank that exits; a node's processes or its connection killed",
            tests=("test_chaos.py", "test_launch.py"),
        ),
    ),
    FindingId.RANK_HUNG: Entry(
        area=_RUN,
        title="no rank advances a step",
        seen="everything blocks until the process-group timeout (30 min for gloo)",
        detect="heartbeats: no step past --hang-timeout; every rank's stack (py-spy) and the "
        "rank behind",
        fix="the rank and the place it waits, as printed",
        sandbox=Sandbox(
            setup="a rank stopped with SIGSTOP; a node's link set down",
            tests=("test_chaos.py", "test_launch.py"),
        ),
    ),
    FindingId.ORPHAN_PROCESSES: Entry(
        area=_RUN,
        title="a node could not confirm that the job's processes ended",
        seen="leftover ranks hold GPUs and port 29500",
        detect="each node's bootstrap kills its whole process group when the launcher goes "
        "away; a node that could not confirm it is named",
        fix="check that node once it answers: `trainfleet exec ... -- ps -eo pid,args`",
    ),
    FindingId.NESTED_LAUNCHER: Entry(
        area=_RUN,
        title="the command starts a launcher of its own inside each rank",
        seen="`torchrun`, `deepspeed`, `accelerate launch` or FORCE_TORCHRUN=1 starts a second "
        "layer of ranks per rank",
        detect="the launcher word in the command is refused before anything starts, with the "
        "command to use instead (the refusal does not carry the id yet)",
        fix="the script and its arguments after `--`",
        planned=True,
    ),
    FindingId.OUTPUT_NOT_SHARED: Entry(
        area=_RUN,
        title="`trainfleet train`'s OUTPUT is not on storage every node mounts",
        seen="each node writes its own partial checkpoints",
        detect="every rank looks for a file written on the launch node under OUTPUT; a "
        "restart would meet it again, so none is made",
        fix="put --output on storage every node mounts",
    ),
}


# ----------------------------------------------------------------------------- docs/findings.md

_HOW = "python -m trainfleet.catalog --markdown > docs/findings.md"
_COLUMNS = ("id", "what you see", "how trainfleet finds it", "fix", "sandbox test")


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def _sandbox_cell(entry: Entry) -> str:
    box = entry.sandbox
    if box is None:
        return "no"
    how = [f"`--fault {name}`" for name in box.faults] + ([box.setup] if box.setup else [])
    return "; ".join(how) + " (" + ", ".join(box.tests) + ")"


def markdown() -> str:
    """docs/findings.md: one section per area, one table row per id."""
    lines = [
        f"<!-- Generated from src/trainfleet/catalog.py by `{_HOW}`: edit that, not this. -->",
        "# Findings",
        "",
        "Every id trainfleet reports (`doctor`, `--json`, launch diagnoses, restart causes),",
        "grouped by where the failure lives. *Planned*: a known failure trainfleet does not",
        "report yet; its row says what it should do. The sandbox column names the",
        "`trainfleet sandbox up --fault` or the set-up that reproduces it and the tests under",
        "tests/cluster/ that assert the id; `no`: no sandbox test (no GPU, InfiniBand or clock",
        "there, or none written yet).",
    ]
    for area in Area:
        lines += ["", f"## {area.value}", ""]
        lines += ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
        for finding, entry in CATALOG.items():
            if entry.area is not area:
                continue
            name = f"`{finding}`" + (" (planned)" if entry.planned else "") + f": {entry.title}"
            row = (name, entry.seen, entry.detect, entry.fix, _sandbox_cell(entry))
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainfleet.catalog", description="the finding ids trainfleet reports"
    )
    parser.add_argument("--markdown", action="store_true", help="docs/findings.md's text")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
    else:
        for finding, entry in CATALOG.items():
            print(f"{finding:24} {entry.area.value:9} {entry.title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
