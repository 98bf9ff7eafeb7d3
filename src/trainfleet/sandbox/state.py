"""A sandbox as recorded in its state file (`/run/trainfleet/sandbox/NAME/state.json`), and
where to find it.

    >>> default_subnet("tf")
    '10.213.93.0/24'
    >>> load("nosuch") is None
    True
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainfleet.cluster import DEFAULT_MASTER_PORT
from trainfleet.errors import SandboxError
from trainfleet.sandbox import netns, texts
from trainfleet.sandbox.faults import Fault, parse_fault

DEFAULT_NAME = "tf"
MAX_NODES = 200
_NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")


def state_root() -> Path:
    return Path(os.environ.get("TRAINFLEET_SANDBOX_DIR", "/run/trainfleet/sandbox"))


@dataclass(kw_only=True, slots=True)
class Sandbox:
    """A running (or partly running) sandbox, as recorded in its state file."""

    name: str
    state_dir: Path
    subnet: str
    bridge: str
    nodes: list[texts.SandboxNode]
    faults: list[Fault] = field(default_factory=list)
    slots: int = 1
    master_port: int = DEFAULT_MASTER_PORT
    login_shell: str | None = None
    """root's login shell on the nodes; None keeps this machine's (and its ~/.bashrc)."""
    node_local_dir: str | None = None
    """A path that each node sees as its own private directory (no shared storage there)."""
    auth: str = "key"
    """'key': root logs in with the sandbox's key, trusted everywhere. 'password': only the
    test user (users.SANDBOX_USER) logs in, with its password; no key is trusted anywhere."""
    host_changes: list[str] = field(default_factory=list)
    """What `up` changed on this machine beyond its own links and namespaces (a kernel limit
    raised, with its old value), said once when it is made and kept in the state file."""
    slurm: bool = False
    """Whether it runs a Slurm (munge, slurmctld, a slurmd per node: `sandbox/slurm.py`)."""

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / "cluster.yaml"

    @property
    def password_file(self) -> Path:
        """The test user's password (auth 'password' only)."""
        return self.state_dir / "password"

    @property
    def home(self) -> Path:
        """auth 'password': the test user's home, the same path on every node (each node has
        its own) and here (the launch side's ssh files)."""
        return self.state_dir / "home"

    @property
    def hostfile(self) -> Path:
        return self.state_dir / "hostfile"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh_config"

    def node(self, which: int | str) -> texts.SandboxNode:
        """A node by 1-based index or hostname."""
        for node in self.nodes:
            if which in (node.index, node.hostname):
                return node
        raise SandboxError(f"no sandbox node {which!r}", "see `trainfleet sandbox status`")

    def sshd_pid(self, which: int | str) -> int | None:
        """The pid a node's sshd wrote (its PidFile), or None before it did (or after down)."""
        path = self.state_dir / "nodes" / self.node(which).hostname / "sshd.pid"
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def exec_argv(self, which: int | str, argv: Sequence[str]) -> list[str]:
        """argv run inside a node's namespace directly (no ssh), e.g. to inject a fault."""
        return netns.in_netns(self.node(which).netns, argv)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "state_dir": str(self.state_dir),
            "subnet": self.subnet,
            "bridge": self.bridge,
            "slots": self.slots,
            "master_port": self.master_port,
            "login_shell": self.login_shell,
            "node_local_dir": self.node_local_dir,
            "auth": self.auth,
            "faults": [str(f) for f in self.faults],
            "host_changes": list(self.host_changes),
            "slurm": self.slurm,
            "nodes": [n.to_json() for n in self.nodes],
            "cluster_file": str(self.cluster_file),
            "hostfile": str(self.hostfile),
            "ssh_config": str(self.ssh_config),
        }

    @classmethod
    def from_json(cls, data: dict) -> Sandbox:
        hostnames = [n["hostname"] for n in data["nodes"]]
        return cls(
            name=data["name"],
            state_dir=Path(data["state_dir"]),
            subnet=data["subnet"],
            bridge=data["bridge"],
            slots=data["slots"],
            master_port=data["master_port"],
            login_shell=data.get("login_shell"),
            node_local_dir=data.get("node_local_dir"),
            auth=data.get("auth", "key"),
            faults=[parse_fault(f, hostnames) for f in data["faults"]],
            host_changes=list(data.get("host_changes", [])),
            slurm=data.get("slurm", False),
            nodes=[texts.SandboxNode(**n) for n in data["nodes"]],
        )


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise SandboxError(f"sandbox name {name!r} is not valid", "use 1-8 of [a-z0-9]")
    return name


def default_subnet(name: str, taken: Sequence[ipaddress.IPv4Network] = ()) -> str:
    """A /24 per sandbox name, so that several sandboxes can be up side by side: 10.213.X.0/24
    with X from the name, or the next X whose /24 overlaps nothing in `taken` (the networks
    already on this machine's interfaces: two names can hash alike, and two bridges with one
    subnet would route one sandbox's packets into the other).

        >>> default_subnet("tf", [ipaddress.ip_network("10.213.93.0/24")])
        '10.213.94.0/24'
    """
    first = zlib.crc32(name.encode()) % 250
    for step in range(250):
        subnet = ipaddress.ip_network(f"10.213.{(first + step) % 250 + 1}.0/24")
        if not any(subnet.overlaps(net) for net in taken):
            return str(subnet)
    raise SandboxError(
        "every 10.213.X.0/24 is in use on this machine",
        "take sandboxes down (`trainfleet sandbox down --name NAME`) or give --subnet",
    )


def load(name: str = DEFAULT_NAME) -> Sandbox | None:
    path = state_root() / check_name(name) / "state.json"
    try:
        return Sandbox.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError(
            f"sandbox state {path} is unreadable ({exc})",
            f"run `trainfleet sandbox down --name {name}`",
        ) from None
