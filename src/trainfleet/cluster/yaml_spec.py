r"""cluster.yaml: nodes with their own slots, python, env, interface and ssh options, checked
key by key with the line of every error.

    >>> cluster = parse_cluster_yaml("nodes: [gpu-node-1, {host: gpu-node-2, slots: 4}]\n")
    >>> [(n.host, n.slots) for n in cluster.nodes]
    [('gpu-node-1', 1), ('gpu-node-2', 4)]
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from trainfleet.cluster.model import DEFAULT_MASTER_PORT, Cluster, Node, SshOptions
from trainfleet.cluster.validate import (
    IFACE_RE,
    MAX_SLOTS,
    PATH_RE,
    USER_RE,
    check_env,
    check_host,
    check_int,
    check_pattern,
)
from trainfleet.errors import SpecError
from trainfleet.spec_yaml import LineDict, LineList, load_yaml_with_lines

EXAMPLE_FIX = "see `trainfleet exec --help` for a cluster.yaml example"

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


def resolve_path(value: str, base_dir: Path) -> str:
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
            values[key] = check_pattern(value, "ssh user", USER_RE, source, at)
        elif key in ("port",):
            values[key] = check_int(value, "ssh port", source, at, 1, 65535)
        elif key == "connect_timeout":
            values[key] = check_int(value, "ssh connect_timeout", source, at, 1, 3600)
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
            values[key] = resolve_path(value, base_dir)
    return SshOptions(**values)


def parse_cluster_yaml(text: str, source: str = "cluster.yaml") -> Cluster:
    """Build a Cluster from cluster.yaml text; relative paths are relative to `source`'s dir."""
    base_dir = Path(source).resolve().parent
    doc = load_yaml_with_lines(text, source)
    if not isinstance(doc, LineDict):
        # A scalar does not know its line; the text parsed, so composing it again is safe.
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        line = root.start_mark.line + 1 if root is not None else 1
        raise SpecError(source, line, "must be a mapping with a `nodes:` list", EXAMPLE_FIX)
    _check_keys(doc, _CLUSTER_KEYS, "the cluster", source)
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, LineList) or not raw_nodes:
        raise SpecError(
            source, doc.line_of("nodes"), "`nodes:` must be a non-empty list", EXAMPLE_FIX
        )

    default_slots = check_int(
        doc.get("slots", 1), "slots", source, doc.line_of("slots"), 1, MAX_SLOTS
    )
    python = check_pattern(
        doc.get("python", sys.executable), "python", PATH_RE, source, doc.line_of("python")
    )
    env = check_env(doc.get("env"), source, doc.line_of("env"))
    ssh = _parse_ssh(doc.get("ssh"), source, doc.line_of("ssh"), base_dir)

    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for raw, line in zip(raw_nodes, raw_nodes.item_lines, strict=True):
        if isinstance(raw, str):  # `- gpu-node-1` is short for `- host: gpu-node-1`
            short = LineDict(line)
            short["host"] = raw
            raw = short
        if not isinstance(raw, LineDict):
            raise SpecError(source, line, "each node must be a mapping or a host name", EXAMPLE_FIX)
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
        slots = check_int(
            raw.get("slots", default_slots), "slots", source, raw.line_of("slots"), 1, MAX_SLOTS
        )
        interface = raw.get("interface")
        if interface is not None:
            interface = check_pattern(
                interface, "interface", IFACE_RE, source, raw.line_of("interface")
            )
        nodes.append(
            Node(
                host=host,
                slots=slots,
                gpu_ids=tuple(range(slots)),
                python=check_pattern(
                    raw.get("python", python), "python", PATH_RE, source, raw.line_of("python")
                ),
                env={**env, **check_env(raw.get("env"), source, raw.line_of("env"))},
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
        workdir = check_pattern(workdir, "workdir", PATH_RE, source, doc.line_of("workdir"))
    return Cluster(
        nodes=tuple(nodes),
        master=master,
        master_port=check_int(
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
