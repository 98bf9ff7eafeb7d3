"""cluster.yaml as a document that setup steps change per node, then write with a backup.

    >>> from trainfleet.cluster import load_cluster
    >>> doc = document_for(load_cluster(hosts="gpu-node-1,gpu-node-2"))
    >>> doc = with_node_fields(doc, {"gpu-node-2": {"slots": 8, "interface": "ens14f1"}})
    >>> print(text_of(doc), end="")
    master: gpu-node-1
    master_port: 29500
    nodes:
    - host: gpu-node-1
      slots: 1
    - host: gpu-node-2
      slots: 8
      interface: ens14f1

An existing file keeps its keys, their order and its leading comment block (comments inside
it do not survive a YAML round trip: the old file is kept beside it, as doctor --fix does).
The text is validated with trainfleet's own parser before anything is written.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import yaml

from trainfleet.cluster import Cluster, backup_name, parse_cluster_yaml
from trainfleet.files import write_private


def load_document(path: str) -> tuple[str, dict]:
    """(leading comment block, the document) of an existing cluster.yaml."""
    text = Path(path).read_text()
    header = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        header.append(line)
    return "".join(header), yaml.safe_load(text) or {}


def document_for(cluster: Cluster) -> dict:
    """A cluster.yaml document for a cluster that came from a hostfile or --hosts."""
    doc: dict = {"master": cluster.master, "master_port": cluster.master_port}
    config = cluster.nodes[0].ssh.config_file if cluster.nodes else None
    if config and all(n.ssh.config_file == config for n in cluster.nodes):
        doc["ssh"] = {"config_file": config}
    doc["nodes"] = [{"host": n.host, "slots": n.slots} for n in cluster.nodes]
    return doc


def base_document(cluster: Cluster, cluster_in: str | None, out: str) -> tuple[str, dict]:
    """The cluster.yaml to update: the -c file, else `out` when it lists the same nodes, else
    a new one."""
    if cluster_in:
        return load_document(cluster_in)
    if Path(out).exists():
        header, doc = load_document(out)
        listed = [e["host"] if isinstance(e, dict) else e for e in doc.get("nodes") or []]
        if listed == [node.host for node in cluster.nodes]:
            return header, doc
    return "", document_for(cluster)


def with_node_fields(doc: dict, fields: dict[str, dict]) -> dict:
    """A copy of `doc` with `fields[host]` set on each node (None removes a field; `env` keys
    merge into the node's env)."""
    new = copy.deepcopy(doc)
    nodes = []
    for entry in new.get("nodes", []):
        entry = {"host": entry} if isinstance(entry, str) else entry
        for key, value in fields.get(entry.get("host"), {}).items():
            if value is None:
                entry.pop(key, None)
            elif key == "env":
                entry["env"] = {**(entry.get("env") or {}), **value}
            else:
                entry[key] = value
        nodes.append(entry)
    new["nodes"] = nodes
    return new


def node_changes(old: dict, new: dict) -> dict[str, str]:
    """Per node, the fields `new` sets differently from `old`, as one line."""

    def flat(doc: dict) -> dict[str, dict]:
        entries = {}
        for entry in doc.get("nodes") or []:
            entry = {"host": entry} if isinstance(entry, str) else entry
            values = {k: v for k, v in entry.items() if k not in ("host", "env")}
            entries[entry["host"]] = values | (entry.get("env") or {})
        return entries

    before, after = flat(old), flat(new)
    changes = {}
    for host, values in after.items():
        diff = {k: v for k, v in values.items() if before.get(host, {}).get(k) != v}
        if diff:
            changes[host] = ", ".join(f"{k}: {v}" for k, v in diff.items())
    return changes


def text_of(doc: dict, header: str = "") -> str:
    return header + yaml.safe_dump(doc, sort_keys=False)


def write(path: str, text: str, *, dry_run: bool) -> str | None:
    """Write `text` to `path` unless it holds exactly that; what happened, None if nothing.

    Raises SpecError (from the parser) when `text` is not a cluster.yaml trainfleet accepts.
    """
    parse_cluster_yaml(text, path)
    target = Path(path)
    old = target.read_text() if target.exists() else None
    if old == text:
        return None
    if dry_run:
        return f"would write {path}" if old is None else f"would update {path}"
    if old is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_private(target, text)  # its env may hold secrets
        return f"wrote {path}"
    backup = backup_name(path)
    shutil.copy2(path, backup)  # its mode too: a 0600 cluster.yaml keeps a 0600 backup
    write_private(target, text)
    return f"updated {path} (the old one is kept as {backup})"
