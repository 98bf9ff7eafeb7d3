"""Thin wrappers over `ip`, `ip netns` and process control, as root. Every call is an argv list.

    >>> from trainfleet.sandbox.netns import require_root_and_netns
    >>> require_root_and_netns()  # doctest: +SKIP

Only this module runs the system tools that change the machine's network; `sandbox.lifecycle`
decides what to run.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

from trainfleet.errors import SandboxError

SSHD = "/usr/sbin/sshd"


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> str:
    """Run a system tool; a failure becomes a SandboxError quoting the tool's own message."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise SandboxError(f"`{argv[0]}` not found", _INSTALL_HINT) from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(argv)}` did not finish in {timeout} s", "retry") from None
    if check and proc.returncode != 0:
        raise SandboxError(
            f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}",
            "run `trainfleet sandbox down` to clean up, then try again",
        )
    return proc.stdout


def ipv4_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this machine's interfaces (`ip -o -4 addr show`)."""
    networks = []
    for line in run(["ip", "-o", "-4", "addr", "show"]).splitlines():
        words = line.split()
        if "inet" in words[:-1]:
            networks.append(ipaddress.IPv4Interface(words[words.index("inet") + 1]).network)
    return networks


_INSTALL_HINT = "apt-get install openssh-server openssh-client iproute2 iptables (as root)"


def require_root_and_netns() -> None:
    """The sandbox needs root (network namespaces, sshd) and the `ip`/`sshd` tools."""
    if os.geteuid() != 0:
        raise SandboxError(
            "the sandbox needs root (it creates network namespaces and runs sshd)",
            "run it as root, e.g. `sudo trainfleet sandbox up`",
        )
    for tool in ("ip", "ssh", "ssh-keygen", "unshare", "iptables", "tc"):
        if shutil.which(tool) is None:
            raise SandboxError(f"`{tool}` not found", _INSTALL_HINT)
    if not os.access(SSHD, os.X_OK):
        raise SandboxError(f"{SSHD} not found", _INSTALL_HINT)
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise SandboxError(
            f"`ip netns` does not work here: {probe.stderr.strip()}",
            "use a Linux machine (or a privileged container) where `ip netns add` works",
        )


def netns_list() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", name]
    return subprocess.run(argv, capture_output=True).returncode == 0


def links_with_prefix(prefix: str) -> list[str]:
    names = []
    for line in run(["ip", "-o", "link", "show"]).splitlines():
        # "12: tv-tf-1@if11: <BROADCAST,...>"
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix):
                names.append(name)
    return names


def netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """argv run inside `netns` (with its /etc/netns/NETNS files bind-mounted over /etc)."""
    return ["ip", "netns", "exec", netns, *argv]


def kill_netns_processes(netns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in the namespace and wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise SandboxError(
                f"processes {pids} in {netns} survive SIGKILL",
                "check them with `ps -o pid,stat,cmd -p PIDS` (stuck in the kernel?)",
            )
        time.sleep(0.05)
