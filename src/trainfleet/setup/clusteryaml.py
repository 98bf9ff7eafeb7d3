"""The cluster.yaml a setup step updates: which text it starts from, and what the edit changed
per node, for setup's report. The edit itself is `trainfleet.clusterfile`'s.

    >>> old = "nodes:\\n  - host: a\\n    slots: 8\\n  - b\\n"
    >>> node_changes(old, "nodes:\\n  - host: a\\n    slots: 8\\n    interface: ens1\\n  - b\\n")
    {'a': 'interface: ens1'}
"""

from __future__ import annotations

from pathlib import Path

import yaml

from trainfleet import clusterfile
from trainfleet.cluster import Cluster, parse_cluster_yaml
from trainfleet.clusterfile import new
from trainfleet.setup.result import THIS_MACHINE, SetupResult


def base_text(
    cluster: Cluster, *, cluster_in: str | None, out: str, written_by: str
) -> tuple[str, str]:
    """(text, its source) of the cluster.yaml a setup step updates: the -c file, else `out`
    when it lists the same nodes, else a new one for `cluster`."""
    if cluster_in:
        return Path(cluster_in).read_text(), cluster_in
    if Path(out).exists():
        text = Path(out).read_text()
        listed = [n.host for n in parse_cluster_yaml(text, out).nodes]
        if listed == [node.host for node in cluster.nodes]:
            return text, out
    return new(cluster, written_by=written_by, source=out), out


def node_changes(old: str, new: str) -> dict[str, str]:
    """Per node, the fields cluster.yaml text `new` sets differently from `old`, as one line."""

    def flat(text: str) -> dict[str, dict]:
        entries = {}
        for entry in (yaml.safe_load(text) or {}).get("nodes") or []:
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


def record(
    cluster: Cluster,
    nodes: clusterfile.NodeFields,
    *,
    cluster_in: str | None,
    out: str,
    written_by: str,
    result: SetupResult,
) -> str:
    """Edit `nodes` into the cluster.yaml a step updates (`base_text`), write it unless the
    step is a dry run, and add the file and each node's changed fields to `result`. Returns
    the new text."""
    base, source = base_text(cluster, cluster_in=cluster_in, out=out, written_by=written_by)
    text = clusterfile.edit(base, source, nodes=nodes)
    if done := clusterfile.write(out, text, dry_run=result.dry_run):
        result.add(THIS_MACHINE, done)
        for host, change in node_changes(base, text).items():
            result.add(host, change)
    result.files["cluster"] = out
    return text
