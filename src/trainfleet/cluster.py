"""Cluster spec: which nodes, how to reach them, how many ranks each runs.

    >>> from trainfleet.cluster import load_cluster
    >>> cluster = load_cluster(hosts="gpu-node-1:8,gpu-node-2:8", include="gpu-node-2:0,1")
    >>> [(n.host, n.slots, n.gpu_ids) for n in cluster.nodes]
    [('gpu-node-2', 2, (0, 1))]

Three sources give one model: a DeepSpeed hostfile (`host slots=N`, read exactly as DeepSpeed's
runner reads it), a cluster.yaml, or `--hosts a,b,c`. With none, this machine is a one-node
cluster. DeepSpeed's `--include/--exclude` NODE_SPEC filters (`worker-0@worker-1:0,2`) apply to
any source. Every value that can reach a remote shell is checked here, once, so that nothing a
user did not ask for is ever executed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainfleet.errors import SpecError
from trainfleet.spec_yaml import LineDict, LineList, load_yaml_with_lines

DEFAULT_MASTER_PORT = 29500
"""torchrun's and DeepSpeed's default rendezvous port."""

DEFAULT_CONNECT_TIMEOUT = 10
"""Seconds for ssh's TCP connect + handshake when the spec does not say."""

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Names that mean this machine; such a node runs commands without ssh."""

# Letters, digits and the few punctuation marks that host names, ssh aliases and IPv4/IPv6
# addresses use. No shell metacharacter, no whitespace, no leading '-' (ssh would read an option).
# Every pattern ends in \Z, not $: `$` would also accept a value ending in a newline.
_HOST_RE = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]*\Z")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_IFACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}\Z")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Paths that reach a remote shell (python, workdir): absolute or ~, no metacharacters.
_PATH_RE = re.compile(r"[A-Za-z0-9_./~+,=@%:-]+\Z")
_SLOTS_RE = re.compile(r"[0-9]{1,6}\Z")  # ASCII digits only: str.isdigit() accepts '²'
MAX_SLOTS = 4096
_SHELL_META = set(";&|<>()$`\\\"' \t\n*?[]{}!#~")

# DeepSpeed runner.py `_parse_hostfile` uses `^(\S+)\s+slots=(\d+)`; ASCII digits here.
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=([0-9]+)")


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

    @property
    def is_local(self) -> bool:
        """True when commands for this node run here directly, without ssh."""
        return self.host in LOCAL_HOSTS and self.ssh.user is None and self.ssh.port is None


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


# ----------------------------------------------------------------------------- validation


def _metachars(value: str) -> str:
    found = sorted({ch for ch in value if ch in _SHELL_META or not ch.isprintable()})
    return " ".join(repr(ch) for ch in found)


def check_host(host: str, source: str, line: int | None) -> str:
    """Reject a host that is empty, starts with '-' or holds shell metacharacters."""
    if not host:
        raise SpecError(source, line, "empty host name", "write a host name or address")
    if isinstance(host, str) and _HOST_RE.match(host):
        return host
    if host.startswith("-"):
        problem = f"host name {host!r} starts with '-' (ssh would read it as an option)"
    elif "@" in host:
        problem = f"host name {host!r} holds '@' (the --include/--exclude separator)"
    else:
        bad = _metachars(host) or "characters outside letters, digits and '._:%-'"
        problem = f"host name {host!r} contains shell metacharacters ({bad}); it is never run"
    raise SpecError(
        source,
        line,
        problem,
        "use the node's address or an ssh config alias made of letters, digits and '.-_'"
        " (put the login name in cluster.yaml `ssh: {user: ...}` or ~/.ssh/config)",
    )


def _check_pattern(value: Any, what: str, pattern: re.Pattern[str], source: str, line: int) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(source, line, f"{what} must be a non-empty string", f"set {what}")
    if not pattern.match(value):
        bad = _metachars(value) or "unexpected characters"
        raise SpecError(
            source,
            line,
            f"{what} {value!r} contains characters a remote shell would interpret ({bad})",
            f"use a plain {what} without shell metacharacters",
        )
    return value


def _check_int(value: Any, what: str, source: str, line: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(source, line, f"{what} must be an integer, got {value!r}", f"set {what}")
    if not low <= value <= high:
        raise SpecError(
            source, line, f"{what} must be in {low}..{high}, got {value}", f"set {what}"
        )
    return value


def _check_env(value: Any, source: str, line: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(source, line, "env must be a mapping", "write `env: {NAME: value}`")
    env: dict[str, str] = {}
    for key, val in value.items():
        key_line = value.line_of(key) if isinstance(value, LineDict) else line
        if not isinstance(key, str) or not _ENV_KEY_RE.match(key):
            raise SpecError(
                source,
                key_line,
                f"environment variable name {key!r} is not a valid name",
                "use letters, digits and '_', not starting with a digit",
            )
        if isinstance(val, dict | list) or val is None:
            raise SpecError(
                source, key_line, f"env {key} must be a string or number", f"write `{key}: value`"
            )
        # Values may hold anything: they are always quoted before they reach a shell.
        env[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return env


# ----------------------------------------------------------------------------- hostfile


def _parse_slots(text: str, source: str, line: int | None, host: str) -> int:
    slots = int(text) if _SLOTS_RE.match(text) else -1
    if not 1 <= slots <= MAX_SLOTS:
        shown = text if len(text) <= 12 else text[:12] + "..."
        raise SpecError(
            source,
            line,
            f"slots for {host!r} must be a number in 1..{MAX_SLOTS}, got {shown!r}",
            f"write e.g. `{host} slots=8`",
        )
    return slots


def parse_hostfile(text: str, source: str = "hostfile") -> dict[str, tuple[int, int]]:
    """Hosts and slots, in file order, read as DeepSpeed's runner reads them.

    Returns {host: (slots, line)}. Stricter than DeepSpeed where DeepSpeed would go on with a
    surprise: slots=0 and shell metacharacters are errors.
    """
    pool: dict[str, tuple[int, int]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line == "" or line.startswith("#"):
            continue
        match = _HOSTFILE_LINE.search(line)
        if not match:
            meta = _metachars(line.replace(" ", "").replace("\t", ""))
            raise SpecError(
                source,
                lineno,
                f"bad entry {line!r}"
                + (f" (it holds shell metacharacters {meta}; nothing was run)" if meta else ""),
                "each line is `HOST slots=N` (DeepSpeed/MPI hostfile), a `#` comment or blank",
            )
        host = check_host(match.group(1), source, lineno)
        slots = _parse_slots(match.group(2), source, lineno, host)
        if host in pool:
            raise SpecError(
                source,
                lineno,
                f"host {host!r} appears twice (first on line {pool[host][1]})",
                "keep one entry per node",
            )
        pool[host] = (slots, lineno)
    if not pool:
        raise SpecError(source, None, "no hosts in hostfile", "add lines like `node-1 slots=8`")
    return pool


# ----------------------------------------------------------------------------- include/exclude


def _parse_node_specs(spec: str, flag: str) -> dict[str, list[int]]:
    """`worker-0@worker-1:0,2` -> {'worker-0': [], 'worker-1': [0, 2]} (DeepSpeed's syntax)."""
    result: dict[str, list[int]] = {}
    for part in spec.split("@"):
        host, sep, slot_text = part.partition(":")
        # IPv6 literals hold ':' themselves; DeepSpeed's syntax cannot name their slots.
        if sep and ":" in slot_text:
            host, sep, slot_text = part, "", ""
        check_host(host, flag, None)
        slots: list[int] = []
        if sep:
            for item in slot_text.split(","):
                if not _SLOTS_RE.match(item):
                    raise SpecError(
                        flag,
                        None,
                        f"slot {item!r} for {host!r} is not a number",
                        "write NODE[:SLOT[,SLOT...]][@NODE...], e.g. worker-0@worker-1:0,2",
                    )
                slots.append(int(item))
        result.setdefault(host, []).extend(slots)
    return {host: sorted(set(slots)) for host, slots in result.items()}


def filter_nodes(nodes: list[Node], include: str = "", exclude: str = "") -> list[Node]:
    """Apply DeepSpeed's --include/--exclude to `nodes`, keeping their order."""
    if include and exclude:
        raise SpecError(
            "--include/--exclude", None, "they are mutually exclusive", "give only one of them"
        )
    if not include and not exclude:
        return nodes
    flag = "--include" if include else "--exclude"
    by_host = {node.host: node for node in nodes}
    chosen: dict[str, list[int]] = {} if include else {n.host: list(n.gpu_ids) for n in nodes}
    for host, slots in _parse_node_specs(include or exclude, flag).items():
        if host not in by_host:
            raise SpecError(
                flag,
                None,
                f"host {host!r} is not in the cluster",
                f"known hosts: {', '.join(by_host)}",
            )
        available = by_host[host].gpu_ids
        for slot in slots:
            if slot not in available:
                raise SpecError(
                    flag,
                    None,
                    f"no slot {slot} on host {host!r} (it has {list(available)})",
                    "use slot indices the node has",
                )
        if include:
            chosen[host] = slots or list(available)
        else:
            chosen[host] = [s for s in chosen[host] if slots and s not in slots]
    kept = [
        replace(node, slots=len(chosen[node.host]), gpu_ids=tuple(chosen[node.host]))
        for node in nodes
        if chosen.get(node.host)
    ]
    if not kept:
        raise SpecError(flag, None, "no node is left", "keep at least one node")
    return kept


# ----------------------------------------------------------------------------- cluster.yaml

_CLUSTER_KEYS = ("nodes", "master", "master_port", "workdir", "python", "env", "ssh", "slots")
_NODE_KEYS = ("host", "slots", "python", "env", "interface", "ssh")
_SSH_KEYS = tuple(f.name for f in fields(SshOptions))


def _check_keys(mapping: LineDict, valid: tuple[str, ...], where: str, source: str) -> None:
    for key in mapping:
        if key not in valid:
            raise SpecError(
                source,
                mapping.line_of(key),
                f"unknown key {key!r} in {where}",
                f"valid keys: {', '.join(valid)}",
            )


def _resolve_path(value: str, base_dir: Path) -> str:
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base_dir / path).resolve())


_UNCHECKED_HOST_KEYS = re.compile(
    r"StrictHostKeyChecking\s*[= ]\s*(?:no|off|false|accept-new)\b"
    r"|UserKnownHostsFile\s*[= ]\s*/dev/null\b",
    re.IGNORECASE,
)
"""ssh options that make ssh trust a host key it has never seen (ssh takes the first value of
an option, so one in cluster.yaml would win over trainfleet's own -oStrictHostKeyChecking=yes)."""


def _parse_ssh(raw: Any, source: str, line: int, base_dir: Path) -> SshOptions:
    if raw is None:
        return SshOptions()
    if not isinstance(raw, LineDict):
        raise SpecError(source, line, "ssh must be a mapping", "write `ssh: {user: ..., port: 22}`")
    _check_keys(raw, _SSH_KEYS, "ssh", source)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        at = raw.line_of(key)
        if key == "user":
            values[key] = _check_pattern(value, "ssh user", _USER_RE, source, at)
        elif key in ("port",):
            values[key] = _check_int(value, "ssh port", source, at, 1, 65535)
        elif key == "connect_timeout":
            values[key] = _check_int(value, "ssh connect_timeout", source, at, 1, 3600)
        elif key == "options":
            if not isinstance(value, list) or not all(
                isinstance(v, str) and "\0" not in v for v in value
            ):
                raise SpecError(
                    source, at, "ssh options must be a list of strings", 'write ["-o", "K=V"]'
                )
            unchecked = _UNCHECKED_HOST_KEYS.search(" ".join(value))
            if unchecked:
                raise SpecError(
                    source,
                    at,
                    f"ssh options turn host key checking off ({unchecked.group(0)}): any machine"
                    " that answers for a node would get the job, its data and its secrets, and"
                    " trainfleet's own strict checks would be overridden",
                    "remove it: `trainfleet setup ssh` trusts every node's key once, after"
                    " showing the fingerprints (or give it the keys with --known-hosts FILE)",
                )
            values[key] = tuple(value)
        else:
            if not isinstance(value, str) or not value or "\0" in value:
                raise SpecError(source, at, f"ssh {key} must be a path", f"set ssh {key}")
            values[key] = _resolve_path(value, base_dir)
    return SshOptions(**values)


def parse_cluster_yaml(text: str, source: str = "cluster.yaml") -> Cluster:
    """Build a Cluster from cluster.yaml text; relative paths are relative to `source`'s dir."""
    base_dir = Path(source).resolve().parent
    doc = load_yaml_with_lines(text, source)
    if not isinstance(doc, LineDict):
        raise SpecError(source, None, "must be a mapping with a `nodes:` list", _EXAMPLE_FIX)
    _check_keys(doc, _CLUSTER_KEYS, "the cluster", source)
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, LineList) or not raw_nodes:
        raise SpecError(
            source, doc.line_of("nodes"), "`nodes:` must be a non-empty list", _EXAMPLE_FIX
        )

    default_slots = _check_int(
        doc.get("slots", 1), "slots", source, doc.line_of("slots"), 1, MAX_SLOTS
    )
    python = _check_pattern(
        doc.get("python", sys.executable), "python", _PATH_RE, source, doc.line_of("python")
    )
    env = _check_env(doc.get("env"), source, doc.line_of("env"))
    ssh = _parse_ssh(doc.get("ssh"), source, doc.line_of("ssh"), base_dir)

    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for raw, line in zip(raw_nodes, raw_nodes.item_lines, strict=True):
        if isinstance(raw, str):  # `- gpu-node-1` is short for `- host: gpu-node-1`
            short = LineDict(line)
            short["host"] = raw
            raw = short
        if not isinstance(raw, LineDict):
            raise SpecError(
                source, line, "each node must be a mapping or a host name", _EXAMPLE_FIX
            )
        _check_keys(raw, _NODE_KEYS, "a node", source)
        if "host" not in raw:
            raise SpecError(source, line, "node without `host:`", "add `host: NAME_OR_ADDRESS`")
        host = raw["host"]
        if not isinstance(host, str):
            raise SpecError(
                source,
                raw.line_of("host"),
                f"host must be a string, got {host!r}",
                "quote the host name",
            )
        check_host(host, source, raw.line_of("host"))
        if host in seen:
            raise SpecError(
                source,
                raw.line_of("host"),
                f"host {host!r} appears twice (first on line {seen[host]})",
                "keep one entry per node",
            )
        seen[host] = raw.line_of("host")
        slots = _check_int(
            raw.get("slots", default_slots), "slots", source, raw.line_of("slots"), 1, MAX_SLOTS
        )
        interface = raw.get("interface")
        if interface is not None:
            interface = _check_pattern(
                interface, "interface", _IFACE_RE, source, raw.line_of("interface")
            )
        nodes.append(
            Node(
                host=host,
                slots=slots,
                gpu_ids=tuple(range(slots)),
                python=_check_pattern(
                    raw.get("python", python), "python", _PATH_RE, source, raw.line_of("python")
                ),
                env={**env, **_check_env(raw.get("env"), source, raw.line_of("env"))},
                interface=interface,
                ssh=_parse_ssh(raw.get("ssh"), source, raw.line_of("ssh"), base_dir).merged_over(
                    ssh
                ),
            )
        )

    master = doc.get("master", nodes[0].host)
    if not isinstance(master, str) or master not in seen:
        raise SpecError(
            source,
            doc.line_of("master"),
            f"master {master!r} is not one of the nodes",
            f"use one of: {', '.join(seen)}",
        )
    workdir = doc.get("workdir")
    if workdir is not None:
        workdir = _check_pattern(workdir, "workdir", _PATH_RE, source, doc.line_of("workdir"))
    return Cluster(
        nodes=tuple(nodes),
        master=master,
        master_port=_check_int(
            doc.get("master_port", DEFAULT_MASTER_PORT),
            "master_port",
            source,
            doc.line_of("master_port"),
            1,
            65535,
        ),
        workdir=workdir,
        env=env,
        source=source,
    )


_EXAMPLE_FIX = "see `trainfleet exec --help` for a cluster.yaml example"


# ----------------------------------------------------------------------------- entry point


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(
            path,
            None,
            f"{what} not found",
            "pass an existing file (DeepSpeed would quietly run on this node alone; we stop)",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            path, None, f"cannot read {what} ({exc})", "check the path and its permissions"
        ) from None


def _parse_hosts_flag(hosts: str) -> list[tuple[str, int]]:
    entries = []
    for item in hosts.split(","):
        item = item.strip()
        host, sep, slots_text = item.rpartition(":")
        if not sep or ":" in host:  # no slots given, or an IPv6 literal (several ':')
            host, slots = item, 1
        else:
            slots = _parse_slots(slots_text, "--hosts", None, host)
        check_host(host, "--hosts", None)
        entries.append((host, slots))
    if len({h for h, _ in entries}) != len(entries):
        raise SpecError("--hosts", None, "a host appears twice", "name each node once")
    return entries


def load_cluster(
    *,
    hostfile: str | None = None,
    cluster_file: str | None = None,
    hosts: str | None = None,
    include: str = "",
    exclude: str = "",
    ssh_config: str | None = None,
    num_nodes: int | None = None,
    num_gpus: int | None = None,
    visible_devices: str | None = None,
    local_gpus: int | None = None,
) -> Cluster:
    """The cluster from exactly one source (or this machine alone), filtered by include/exclude
    or cut by num_nodes/num_gpus, as DeepSpeed's runner does.

    `ssh_config` (an ssh config file, like `ssh -F`) applies to every node that does not name
    its own. `visible_devices` (the launch shell's CUDA_VISIBLE_DEVICES) gives this machine's
    slots when no source is given, as DeepSpeed's runner does; `local_gpus` is this machine's
    GPU count (None: counted from /dev/nvidia*).
    """
    _check_num_flags(num_nodes, num_gpus, include, exclude)
    given = [
        name
        for name, value in (
            ("--hostfile", hostfile),
            ("--cluster", cluster_file),
            ("--hosts", hosts),
        )
        if value
    ]
    if len(given) > 1:
        raise SpecError(
            " and ".join(given),
            None,
            "more than one cluster source given",
            "pass only one of --hostfile, --cluster, --hosts",
        )
    base_ssh = SshOptions(config_file=_resolve_path(ssh_config, Path.cwd()) if ssh_config else None)
    python = sys.executable
    if cluster_file:
        cluster = parse_cluster_yaml(_read(cluster_file, "cluster file"), cluster_file)
        nodes = [replace(n, ssh=n.ssh.merged_over(base_ssh)) for n in cluster.nodes]
    else:
        if hostfile:
            pool = parse_hostfile(_read(hostfile, "hostfile"), hostfile)
            entries = [(host, slots) for host, (slots, _) in pool.items()]
            source = hostfile
        elif hosts:
            entries = _parse_hosts_flag(hosts)
            source = "--hosts"
        else:
            gpus = _local_gpu_count() if local_gpus is None else local_gpus
            entries = [("localhost", gpus or 1)]
            source = "<local>"
            if visible_devices and not (include or exclude or num_gpus or (num_nodes or 0) > 1):
                # DeepSpeed's runner: `--include localhost:<CUDA_VISIBLE_DEVICES>`.
                ids = _visible_ids(visible_devices, gpus)
                include = "localhost:" + ",".join(map(str, ids))
                entries = [("localhost", max(gpus, max(ids) + 1))]
            elif (num_nodes or 0) > 1:
                raise SpecError(
                    "--num_nodes",
                    None,
                    f"{num_nodes} nodes asked for, but no hostfile names other nodes",
                    "pass --hostfile, -c cluster.yaml or --hosts",
                )
        nodes = [
            Node(host=h, slots=s, gpu_ids=tuple(range(s)), python=python, ssh=base_ssh)
            for h, s in entries
        ]
        cluster = Cluster(nodes=tuple(nodes), master=nodes[0].host, source=source)
    nodes = filter_nodes(nodes, include, exclude)
    nodes = _apply_num_flags(nodes, num_nodes, num_gpus)
    master = cluster.master if any(n.host == cluster.master for n in nodes) else nodes[0].host
    return replace(cluster, nodes=tuple(nodes), master=master)


def _check_num_flags(
    num_nodes: int | None, num_gpus: int | None, include: str, exclude: str
) -> None:
    for flag, value in (("--num_nodes", num_nodes), ("--num_gpus", num_gpus)):
        if value is not None and value < 1:
            raise SpecError(flag, None, f"must be 1 or more, got {value}", f"pass {flag} N")
    if (num_nodes is not None or num_gpus is not None) and (include or exclude):
        # DeepSpeed's runner: "Cannot specify num_nodes/gpus with include/exclude".
        raise SpecError(
            "--num_nodes/--num_gpus",
            None,
            "cannot be combined with --include/--exclude (as in DeepSpeed's runner)",
            "choose the nodes and slots with one of them",
        )


def _apply_num_flags(nodes: list[Node], num_nodes: int | None, num_gpus: int | None) -> list[Node]:
    """DeepSpeed's --num_nodes (the first N nodes) and --num_gpus (slots 0..N-1 on each)."""
    if num_nodes is not None:
        nodes = nodes[:num_nodes]
    if num_gpus is not None:
        short = [n for n in nodes if num_gpus > n.slots]
        if short:
            # DeepSpeed would start the ranks anyway and fail on the node.
            raise SpecError(
                "--num_gpus",
                None,
                f"{num_gpus} slots asked for, but {short[0].host} has {short[0].slots}",
                "pass a --num_gpus no larger than every node's slots",
            )
        nodes = [replace(n, slots=num_gpus, gpu_ids=tuple(range(num_gpus))) for n in nodes]
    return nodes


def _visible_ids(visible: str, gpus: int) -> list[int]:
    """CUDA_VISIBLE_DEVICES as a slot list, checked against this machine's GPUs (none found:
    taken as given)."""
    ids = [item.strip() for item in visible.split(",") if item.strip()]
    if not all(_SLOTS_RE.match(item) for item in ids):
        raise SpecError(
            "CUDA_VISIBLE_DEVICES",
            None,
            f"{visible!r} is not a list of GPU indices (UUIDs and MIG names are not slots)",
            "set CUDA_VISIBLE_DEVICES=0,2 (indices), or pass -i localhost:0,2",
        )
    missing = [i for i in ids if gpus and int(i) >= gpus]
    if missing:
        raise SpecError(
            "CUDA_VISIBLE_DEVICES",
            None,
            f"names GPU {missing[0]}, but this machine has {gpus} (0-{gpus - 1})",
            "name GPUs this machine has",
        )
    return [int(i) for i in ids]


def _local_gpu_count() -> int:
    """NVIDIA GPUs on this machine, from device nodes (no driver call, no torch import)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*"))
