"""cluster.yaml on disk: the one place that changes it, keeping the user's comments and layout.

    >>> text = "# our boxes\\nnodes:\\n  - host: a   # the master\\n    slots: 8\\n  - b\\n"
    >>> pins = {"a": {"interface": "ens1"}, "b": {"slots": 2}}
    >>> print(edit(text, "cluster.yaml", nodes=pins), end="")
    # our boxes
    nodes:
      - host: a   # the master
        interface: ens1
        slots: 8
      - {host: b, slots: 2}

`doctor --fix` pins interfaces with it; `setup hostfile` and `setup env` record slots,
interfaces, pythons and env per node. Each change is made in the text, at the place where
PyYAML's parser says the value is; every other character stays where it was. A key a node
lacks goes on the line after its `host:` (an env entry after the node's last one); a node
written as a plain name (`- gpu-node-3`) becomes `{host: gpu-node-3, ...}`.

Values are written as YAML reads them back (quoted where needed), a node's own words only once
`trainfleet.untrusted` accepts them, and the result must load with trainfleet's own parser as
exactly the intended cluster: every node, slot, interface, python, env and ssh setting as it
was except the changes asked for, or nothing is written (ClusterFileError). `write` and `save`
replace the file in one step, the old one kept beside it with its mode.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from trainfleet.cluster import Cluster, parse_cluster_yaml
from trainfleet.errors import ClusterFileError, SpecError
from trainfleet.privatefiles import keep_copy, replace_atomically
from trainfleet.untrusted import printable, valid_interface

NODE_KEYS = ("slots", "python", "interface", "env")
"""What `edit` sets on a node; `env` entries merge into the node's own."""
TOP_KEYS = ("master", "master_port", "workdir")
"""What `edit` sets for the whole cluster."""


class NodeEdit(TypedDict, total=False):
    """What `edit` sets on one node (the keys of NODE_KEYS); `env` entries merge."""

    slots: int
    python: str
    interface: str
    env: Mapping[str, str]


class ClusterEdit(TypedDict, total=False):
    """What `edit` sets for the whole cluster (the keys of TOP_KEYS)."""

    master: str
    master_port: int
    workdir: str


NodeFields = Mapping[str, NodeEdit]
"""host -> what to set on it."""

_NOTHING_WRITTEN = "nothing was written; make the change by hand"


# ----------------------------------------------------------------------------- the edit


def edit(
    text: str,
    source: str,
    *,
    nodes: NodeFields | None = None,
    top: ClusterEdit | None = None,
) -> str:
    """cluster.yaml `text` with `nodes[host]` set on each node and `top` set on the cluster;
    every other line, comment and blank kept. Raises SpecError when `text` does not load now,
    ClusterFileError when a value is not one to write or the result would not read back as
    exactly that change."""
    nodes, top = nodes or {}, top or ClusterEdit()
    _check_values(nodes, top)
    before = parse_cluster_yaml(text, source)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, MappingNode):  # parse_cluster_yaml read it as a mapping
        raise SpecError(source, None, "not a mapping at the top", "start it with `nodes:`")
    edits = _Edits(text, source)
    entries = _node_entries(root)
    for host, fields in nodes.items():
        if host not in entries:
            raise ClusterFileError(f"{source}: node {host} not found", "add it to `nodes:` first")
        if fields:
            _set_on_node(edits, entries[host], fields)
    if top:
        _set_keys(edits, root, dict(top), after=None)
    edited = edits.apply()
    _check_reads_back(edited, source, _intended(before, nodes, top))
    return edited


def new(
    cluster: Cluster,
    *,
    nodes: NodeFields | None = None,
    written_by: str,
    source: str = "cluster.yaml",
) -> str:
    """A new cluster.yaml for a cluster that came from a hostfile or --hosts: its master, port,
    nodes and slots (and its ssh config file when every node has the same one), with `nodes`
    set on them."""
    lines = [
        f"# written by `{written_by}` from {printable(cluster.source)}; use it with -c",
        f"master: {_scalar(cluster.master)}",
        f"master_port: {cluster.master_port}",
    ]
    config = cluster.nodes[0].ssh.config_file if cluster.nodes else None
    if config and all(n.ssh.config_file == config for n in cluster.nodes):
        lines += ["ssh:", f"  config_file: {_scalar(config)}"]
    lines.append("nodes:")
    for node in cluster.nodes:
        lines += [f"  - host: {_scalar(node.host)}", f"    slots: {node.slots}"]
    text = "\n".join(lines) + "\n"
    written = _load(text, source, f"the new {source}")
    want = (cluster.master, cluster.master_port, [(n.host, n.slots) for n in cluster.nodes])
    got = (written.master, written.master_port, [(n.host, n.slots) for n in written.nodes])
    if got != want or any(n.interface or n.env for n in written.nodes):
        raise ClusterFileError(f"the new {source} does not read back as planned", _NOTHING_WRITTEN)
    return edit(text, source, nodes=nodes)


def _check_values(nodes: NodeFields, top: ClusterEdit) -> None:
    """Values of the right type; an interface (a node's own word) only when it is a name."""
    for host, fields in nodes.items():
        for key, value in fields.items():
            if key not in NODE_KEYS:
                raise ValueError(f"edit sets {', '.join(NODE_KEYS)} on a node, not {key!r}")
            if key == "interface" and not valid_interface(value):
                raise ClusterFileError(
                    f"interface of {host}: {printable(str(value))[:60]!r} is not an interface name",
                    _NOTHING_WRITTEN,
                )
            if key == "slots" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"slots of {host} must be an int, got {value!r}")
            if key == "python" and not isinstance(value, str):
                raise ValueError(f"python of {host} must be a str, got {value!r}")
            if key == "env" and not (
                isinstance(value, Mapping)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
            ):
                raise ValueError(f"env of {host} must map names to strings, got {value!r}")
    for key, value in top.items():
        kind = int if key == "master_port" else str
        if key not in TOP_KEYS or isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"edit sets {', '.join(TOP_KEYS)} on the cluster, not {key}={value!r}")


def _intended(before: Cluster, nodes: NodeFields, top: ClusterEdit) -> Cluster:
    """`before` with the asked changes and nothing else: what the edited file must load as."""
    changed = []
    for node in before.nodes:
        fields = nodes.get(node.host, NodeEdit())
        slots = fields.get("slots", node.slots)
        changed.append(
            replace(
                node,
                slots=slots,
                gpu_ids=tuple(range(slots)) if "slots" in fields else node.gpu_ids,
                python=fields.get("python", node.python),
                interface=fields.get("interface", node.interface),
                env={**node.env, **fields.get("env", {})},
            )
        )
    return replace(before, nodes=tuple(changed), **top)


def _load(text: str, source: str, what: str) -> Cluster:
    """`text` as trainfleet loads it; ClusterFileError naming `what` when it does not."""
    try:
        return parse_cluster_yaml(text, source)
    except SpecError as exc:
        raise ClusterFileError(f"{what} would not load ({exc})", _NOTHING_WRITTEN) from None


def _check_reads_back(text: str, source: str, intended: Cluster) -> None:
    got = _load(text, source, f"{source}: the edited file")
    if got == intended:
        return
    hosts = [n.host for n in got.nodes]
    differ = [h for h in hosts if h not in {n.host for n in intended.nodes}]
    differ += [n.host for n in intended.nodes if n.host not in hosts or got.node(n.host) != n]
    fields = ("master", "master_port", "workdir", "env")
    differ += [f"the cluster's {f}" for f in fields if getattr(got, f) != getattr(intended, f)]
    raise ClusterFileError(
        f"{source}: the edited file would not load as the asked change alone ("
        f"{', '.join(differ)} would differ; is a YAML anchor or alias shared there?)",
        _NOTHING_WRITTEN,
    )


# ----------------------------------------------------------------------------- text edits


class _Edits:
    """Replacements of spans of `text`, applied at once (the spans come from one parse)."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.spans: list[tuple[int, int, int, str]] = []

    def replace(self, node: Node, new: str) -> None:
        start, end = node.start_mark.index, node.end_mark.index
        self.spans.append((start, end, len(self.spans), new))

    def insert(self, at: int, new: str) -> None:
        self.spans.append((at, at, len(self.spans), new))

    def insert_lines(self, at: int, lines: str) -> None:
        if at > 0 and self.text[at - 1] != "\n":  # the file's last line has no newline
            lines = "\n" + lines
        self.insert(at, lines)

    def refuse(self, node: Node, why: str) -> ClusterFileError:
        return ClusterFileError(
            f"{self.source}:{node.start_mark.line + 1}: cannot edit this entry ({why})",
            _NOTHING_WRITTEN,
        )

    def apply(self) -> str:
        text = self.text
        # From the end, so that earlier indices still hold; inserts at one place keep order.
        for start, end, _, new in sorted(self.spans, key=lambda s: (s[0], s[2]), reverse=True):
            text = text[:start] + new + text[end:]
        return text


def _scalar(value: object, *, flow: bool = False) -> str:
    """`value` as one YAML scalar that reads back as itself (`flow`: inside `{...}`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    width = 2**31 - 1
    if flow:  # the emitter quotes what a flow collection would misread (`,`, `:`, `{`)
        written = yaml.safe_dump([value], default_flow_style=True, width=width)[1:-2]
    else:
        written = yaml.safe_dump(value, width=width, allow_unicode=True).removesuffix("\n...\n")
        written = written.rstrip("\n")
    if "\n" in written:  # a line break inside: one double-quoted line (JSON is YAML)
        return json.dumps(value, ensure_ascii=False)
    return written


def _flow(value: object) -> str:
    if isinstance(value, Mapping):
        items = ", ".join(f"{_scalar(k, flow=True)}: {_flow(v)}" for k, v in value.items())
        return "{" + items + "}"
    return _scalar(value, flow=True)


def _get(mapping: MappingNode, key: str) -> Node | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node
    return None


def _node_entries(root: MappingNode) -> dict[str, MappingNode | ScalarNode]:
    """host -> its entry in `nodes:` (a mapping, or a scalar for the `- host` short form)."""
    listed = _get(root, "nodes")
    entries: dict[str, MappingNode | ScalarNode] = {}
    for entry in listed.value if isinstance(listed, SequenceNode) else []:
        if isinstance(entry, ScalarNode):
            entries[entry.value] = entry
        elif isinstance(entry, MappingNode) and isinstance(host := _get(entry, "host"), ScalarNode):
            entries[host.value] = entry
    return entries


def _set_on_node(edits: _Edits, entry: MappingNode | ScalarNode, fields: NodeEdit) -> None:
    if isinstance(entry, ScalarNode):  # `- gpu-node-3` becomes `- {host: gpu-node-3, ...}`
        host = edits.text[entry.start_mark.index : entry.end_mark.index]
        items = "".join(f", {key}: {_flow(value)}" for key, value in fields.items())
        edits.replace(entry, "{host: " + host + items + "}")
        return
    rest: dict[str, object] = {key: value for key, value in fields.items() if key != "env"}
    env = fields.get("env")
    if env is not None:
        found = _get(entry, "env")
        if isinstance(found, MappingNode):
            _set_keys(edits, found, dict(env), after=None)
        elif found is not None:  # `env:` with nothing after it
            _set_value(edits, found, env, flow=entry.flow_style)
        else:
            rest["env"] = env
    _set_keys(edits, entry, rest, after=_get(entry, "host"))


def _set_keys(
    edits: _Edits, mapping: MappingNode, values: dict[str, object], *, after: Node | None
) -> None:
    """Set each key of `values` in `mapping`: in place where it is there, else added (block
    style: on the lines after `after`'s, else after the mapping's last value)."""
    added = {}
    for key, value in values.items():
        found = _get(mapping, key)
        if found is None:
            added[key] = value
        else:
            _set_value(edits, found, value, flow=mapping.flow_style)
    if not added:
        return
    if mapping.flow_style:  # `{host: a, slots: 2}`: before the `}`
        close = mapping.end_mark.index - 1
        if edits.text[close] != "}":
            raise edits.refuse(mapping, "no closing brace where the parser ends it")
        inside = edits.text[mapping.start_mark.index + 1 : close].rstrip()
        comma = "" if not inside or inside.endswith(",") else ","
        items = ", ".join(f"{key}: {_flow(value)}" for key, value in added.items())
        edits.insert(close, f"{comma} {items}" if inside else items)
        return
    indent = " " * mapping.value[0][0].start_mark.column
    lines = []
    for key, value in added.items():
        if isinstance(value, Mapping):
            lines.append(f"{indent}{key}:\n")
            lines += [f"{indent}  {_scalar(k)}: {_scalar(v)}\n" for k, v in value.items()]
        else:
            lines.append(f"{indent}{key}: {_scalar(value)}\n")
    edits.insert_lines(_line_after(edits.text, after or mapping), "".join(lines))


def _set_value(edits: _Edits, found: Node, value: object, *, flow: bool) -> None:
    """Replace a scalar value in place (`flow`: inside `{...}`); an equal one is left as
    written."""
    if not isinstance(found, ScalarNode) or found.style in ("|", ">"):
        raise edits.refuse(found, "the value there is not a one-line scalar")
    written = edits.text[found.start_mark.index : found.end_mark.index]
    new = _flow(value) if isinstance(value, Mapping) else _scalar(value, flow=flow)
    if found.tag.endswith(":null"):  # `key:` with nothing after it, or `~`
        edits.replace(found, new if written else " " + new)
    elif yaml.safe_load(written) != value:
        edits.replace(found, new)


def _line_after(text: str, node: Node) -> int:
    """Where a line goes after `node`: after the line its last scalar ends on (comments kept
    with it), or where a block scalar's lines end."""
    while isinstance(node, MappingNode | SequenceNode) and not node.flow_style and node.value:
        node = node.value[-1][1] if isinstance(node, MappingNode) else node.value[-1]
    if isinstance(node, ScalarNode) and node.style in ("|", ">"):
        return node.end_mark.index
    newline = text.find("\n", node.end_mark.index)
    return len(text) if newline < 0 else newline + 1


# ----------------------------------------------------------------------------- on disk


def backup_name(path: str) -> str:
    """`path.YYYYmmdd-HHMMSS`, made unique: an older backup is never overwritten."""
    stem = f"{path}.{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = stem, 0
    while Path(candidate).exists():
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def save(path: str, text: str, *, backup: str | None) -> None:
    """Replace `path` with `text` in one step, the old file kept as `backup` with its mode
    (None: `path` is new, and an existing file is never overwritten). Raises SpecError when
    `text` is not a cluster.yaml trainfleet loads."""
    parse_cluster_yaml(text, path)
    if backup:
        keep_copy(path, backup)
        replace_atomically(path, text)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(path, text, exclusive=True)  # its env may hold secrets: 0600


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
        save(path, text, backup=None)
        return f"wrote {path}"
    backup = backup_name(path)
    save(path, text, backup=backup)
    return f"updated {path} (the old one is kept as {backup})"
