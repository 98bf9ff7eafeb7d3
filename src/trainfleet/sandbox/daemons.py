"""What runs on a sandbox's nodes once they are made: each node's sshd (in its own UTS and
mount namespaces, its fake GPUs' nvidia-smi laid over /usr/bin, its node-local directory bound),
the `cpu-throttle` fault's cgroup around it, and the processes a fault needs held (the master
port for `port-in-use`, a resolver that never answers for `dns-unreachable`, both
`node/porthold.py`). Also which nodes a fault is on (`faulted`) and which GPUs a node
simulates (`fake_gpus`), read here and by the build (`sandbox/nodes.py`).

    >>> from trainfleet.sandbox.faults import Fault
    >>> box = Sandbox(name="x", state_dir=Path("/nonexistent"), subnet="10.9.9.0/24",
    ...               bridge="b", nodes=[], faults=[Fault("port-in-use", 1)])
    >>> faulted(box, "port-in-use"), faulted(box, "cpu-throttle"), fake_gpus(box, 1)
    ({1}, set(), None)
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.errors import SandboxError
from trainfleet.node import porthold
from trainfleet.sandbox import cpu, fakegpu, hostile, netns
from trainfleet.sandbox.faults import FAULTS, SILENT_RESOLVER
from trainfleet.sandbox.state import Sandbox

_SSHD_START_TIMEOUT_S = 15.0


def faulted(sandbox: Sandbox, fault_name: str) -> set[int]:
    """The nodes given `fault_name`. A name not in the catalog is a bug here, never a fault
    that silently injects nothing."""
    if fault_name not in FAULTS:
        raise KeyError(f"no sandbox fault {fault_name!r}")
    return {f.node for f in sandbox.faults if f.name == fault_name}


FAKE_GPU_DIR = "fakegpu"
"""In a node's directory: its simulated GPUs' spec and the `nvidia-smi` and `dmesg` wrappers
(bin/), laid over its /usr/bin (`start_sshds`)."""


def fake_gpus(sandbox: Sandbox, index: int) -> fakegpu.FakeGpuSpec | None:
    """The GPUs node `index` simulates: those of its `fake-gpu*` fault; None: it has none."""
    specs = [(f.name, f.kind.gpus) for f in sandbox.faults if f.node == index and f.kind.gpus]
    if len(specs) > 1:
        names = ", ".join(name for name, _ in specs)
        raise SandboxError(
            f"node {index} is given {len(specs)} fake-gpu faults ({names})",
            "give each node at most one fake-gpu* fault",
        )
    return specs[0][1] if specs else None


def _claimed_torch(sandbox: Sandbox, index: int, directory: Path) -> tuple[Path, Path] | None:
    """(the layer, site-packages) where node `index`'s fake GPUs claim a torch build."""
    gpus = fake_gpus(sandbox, index)
    if gpus is None or gpus.torch is None:
        return None
    try:
        return fakegpu.torch_claim(directory, gpus.torch)
    except (ImportError, FileNotFoundError, OSError) as exc:
        raise SandboxError(
            f"fake-gpu on node {index}: cannot claim torch {gpus.torch} ({exc})",
            "install torch in the python that runs trainfleet (make test does)",
        ) from None


def start_sshds(sandbox: Sandbox) -> None:
    """Every node's sshd, in the node's network namespace and its own UTS and mount namespaces
    (none on a node-down node; an impostor's claims another node's name), each waited for
    until it listens on port 22."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    down_nodes = faulted(sandbox, "node-down")
    impostors = faulted(sandbox, "hostname-impostor")
    hostnames = [node.hostname for node in sandbox.nodes]
    starting = []
    for node in sandbox.nodes:
        if node.index in down_nodes:
            continue
        said = hostile.claimed_name(hostnames, node.index) if node.index in impostors else None
        node_dir = sandbox.state_dir / "nodes" / node.hostname
        # Own UTS namespace: every ssh session into the node sees its hostname; own mount
        # namespace: the node-local directory, if any, is private to it.
        script = 'hostname "$1" && exec "$2" -f "$3" -E "$4"'
        if sandbox.node_local_dir:
            local = node_dir / "local"
            local.mkdir(exist_ok=True)
            if sandbox.auth == "password":  # the test user's, as a data disk given to it
                owner = (node_dir / "home").stat()
                os.chown(local, owner.st_uid, owner.st_gid)
            script = f'mount --bind "$5" "$6" && {script}'
        if sandbox.auth == "password":  # the node's own home, at the one home path
            script = f'mount --bind "$7" "$8" && {script}'
        fake_bin = node_dir / FAKE_GPU_DIR / "bin"
        if fake_gpus(sandbox, node.index) is not None:
            # Where the node's nvidia-smi would be, found by any PATH: the wrappers over its
            # /usr/bin (read-only, this node's mount namespace only; gone with it at `down`).
            if set(str(fake_bin)) & {":", ","}:
                raise SandboxError(
                    f"{fake_bin} holds ':' or ',', which overlayfs options cannot",
                    "set TRAINFLEET_SANDBOX_DIR to a path without them",
                )
            script = f'mount -t overlay overlay -o "lowerdir=$9:/usr/bin" /usr/bin && {script}'
        claimed = _claimed_torch(sandbox, node.index, node_dir / FAKE_GPU_DIR)
        if claimed is not None:  # this node's torch metadata says a CUDA build
            script = f'mount -t overlay overlay -o "lowerdir=${{10}}:${{11}}" "${{11}}" && {script}'
        argv = netns.in_netns(
            node.netns,
            [
                "unshare", "--uts", "--mount", "sh", "-c", script, "sh",
                said or node.hostname, netns.SSHD, str(node_dir / "sshd_config"),
                str(node_dir / "sshd.log"), str(node_dir / "local"),
                sandbox.node_local_dir or "", str(node_dir / "home"), str(sandbox.home),
                str(fake_bin), *(str(path) for path in claimed or ()),
            ],
        )  # fmt: skip
        starting.append(
            (
                node,
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
            )
        )
    for node, proc in starting:
        _, err = proc.communicate(timeout=_SSHD_START_TIMEOUT_S)
        if proc.returncode != 0:
            raise SandboxError(
                f"sshd on {node.hostname} did not start: {err.strip()}",
                f"see {sandbox.state_dir}/nodes/{node.hostname}/sshd.log",
            )
    deadline = time.monotonic() + _SSHD_START_TIMEOUT_S
    waiting = [node for node, _ in starting]
    while waiting:
        waiting = [node for node in waiting if not _port_open(node.address, 22)]
        if waiting and time.monotonic() > deadline:
            names = ", ".join(n.hostname for n in waiting)
            raise SandboxError(
                f"sshd on {names} not listening after {_SSHD_START_TIMEOUT_S} s",
                f"see the sshd.log files under {sandbox.state_dir}/nodes",
            )
        time.sleep(0.05)


def throttle_cpus(sandbox: Sandbox) -> None:
    """cpu-throttle: the node's sshd, and so all it starts, into a cgroup with a CPU quota."""
    for index in faulted(sandbox, "cpu-throttle"):
        # sshd listens before it writes its PidFile: it may be a moment behind the port.
        deadline = time.monotonic() + _SSHD_START_TIMEOUT_S
        while (pid := sandbox.sshd_pid(index)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid is None:
            raise SandboxError(
                f"sshd on {sandbox.node(index).hostname} wrote no pid file",
                f"see the sshd.log files under {sandbox.state_dir}/nodes",
            )
        cpu.throttle(f"{cpu.cgroup_prefix(sandbox.name)}{index}", [pid])


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_port_holders(sandbox: Sandbox) -> None:
    """The 'leftover process from the last run' that holds the master port (seed 000 §5.3),
    and the resolver that never answers (`dns-unreachable`)."""
    holds: list[tuple[int, Callable[..., object], list[int | str]]]
    holds = [(i, porthold.hold, [sandbox.master_port]) for i in faulted(sandbox, "port-in-use")]
    holds += [
        (i, porthold.hold_udp, [SILENT_RESOLVER, 53]) for i in faulted(sandbox, "dns-unreachable")
    ]
    for index, function, args in holds:
        argv = sandbox.exec_argv(index, node_programs.argv("python3", function))
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        # Popen types the pipes Optional; both were asked for (PIPE) just above.
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(node_programs.line(function, *args).decode())
        proc.stdin.close()
        if proc.stdout.readline().strip() != "ready":
            raise SandboxError(f"node {index}: the fault's holder could not bind its port", "retry")
        proc.stdout.close()
