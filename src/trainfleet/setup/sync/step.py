"""`trainfleet sync [DIR]`: the same code at the same path on every node that does not share
this machine's copy, so that doctor's `code-differs` goes away.

    >>> from trainfleet.doctor.facts import Active, NodeFacts
    >>> storage_groups({"a": NodeFacts(active=Active(shared={"b": True})),
    ...                 "b": NodeFacts(active=Active(shared={"a": True})), "c": NodeFacts()})
    [['a', 'b'], ['c']]

Facts from doctor's full probe with DIR as the working directory: each node's code hash (the
same files doctor compares) and which nodes see each other's files (shared storage). A node
gets a copy only when its hash differs from this machine's, and of nodes that share storage
only the first: copying over NFS once is enough, and N writers at once are not safe. rsync
over ssh (with --delete) when both sides have it, else tar over ssh and a prune (`transfer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from trainfleet.cluster import Cluster
from trainfleet.doctor.facts import NodeFacts
from trainfleet.errors import SetupError
from trainfleet.node.files import is_excluded
from trainfleet.node.system import code_hash
from trainfleet.nodeset import fold_names
from trainfleet.remote import run_on_nodes
from trainfleet.setup import verify
from trainfleet.setup.result import Confirm, SetupResult
from trainfleet.setup.sync.transfer import choose_method, copy_to

DEFAULT_EXCLUDES = (
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    "runs",
    "outputs",
    "wandb",
    ".trainfleet-doctor-*",
    "trainfleet-runs",
)
"""Not code: history, caches, environments and run outputs (which --delete must never touch)."""


def storage_groups(facts: Mapping[str, NodeFacts]) -> list[list[str]]:
    """Nodes that see each other's files (doctor's shared-storage tokens), grouped, in order."""
    group_of = {host: [host] for host in facts}
    for host, sheet in facts.items():
        for peer, seen in sheet.active.shared.items():
            if seen and peer in group_of and group_of[peer] is not group_of[host]:
                merged = group_of[host] + group_of[peer]
                for member in merged:
                    group_of[member] = merged
    order = list(facts)
    groups = []
    for host in facts:
        if group_of[host] not in groups:
            groups.append(group_of[host])
    return [sorted(g, key=order.index) for g in groups]


def copy_targets(
    facts: Mapping[str, NodeFacts], local_hash: str | None
) -> tuple[list[str], list[str]]:
    """(nodes to copy to, nodes whose copy is the same already or shared with a copied one)."""
    targets, same = [], []
    for group in storage_groups(facts):
        hashes = [_code_hash(facts[h]) for h in group]
        if local_hash and all(value == local_hash for value in hashes):
            same += group
        else:
            targets.append(group[0])
            same += group[1:]
    return targets, same


def _code_hash(facts: NodeFacts) -> str | None:
    return facts.code.sha256 if facts.code else None


SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
               "/dev", "/proc", "/sys", "/run", "/var", "/root/.ssh")  # fmt: skip
"""Never synced with --delete, nor anything under them."""


def _check_directory(directory: str) -> str:
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise SetupError(f"{directory} is not a directory here", "pass the code directory")
    system = [Path(d) for d in SYSTEM_DIRS if path == Path(d) or Path(d) in path.parents]
    if len(path.parts) <= 2 or path in (Path.home(), *Path.home().parents) or system:
        what = "a system directory" if system else "/, a top-level directory or a home directory"
        raise SetupError(
            f"refusing to sync {path} ({what}) with --delete: every node's copy would lose what"
            " is not here",
            "pass the project's own directory",
        )
    return str(path)


def environments_inside(cluster: Cluster, directory: str, excludes: Sequence[str]) -> list[str]:
    """The names of the environments (`setup pyenv`'s venvs) that the nodes' python lives in
    inside `directory`, not excluded yet: --delete would remove them on the nodes."""
    names: list[str] = []
    for node in cluster.nodes:
        env = Path(node.python).parent.parent
        if Path(directory) in env.parents and not is_excluded(env.name, [*excludes, *names]):
            names.append(env.name)
    return names


def sync_code(
    cluster: Cluster,
    directory: str,
    *,
    method: str = "auto",
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    confirm: Confirm,
    dry_run: bool = False,
) -> SetupResult:
    """Copy `directory` to the same path on every node whose copy differs from this one."""
    directory = _check_directory(directory)
    cluster = replace(cluster, workdir=directory)  # doctor hashes and tests this directory
    result = SetupResult(step="sync", dry_run=dry_run)
    if kept := environments_inside(cluster, directory, excludes):
        excludes = (*excludes, *kept)
        result.note(f"{', '.join(kept)} left out: a node's python environment lives there")
    survey = verify.survey(cluster, verify.SYNC)
    down = [host for host in survey.failed]
    if down:
        raise SetupError(
            f"cannot examine {fold_names(down)}: "
            + "; ".join(r.reason() for r in survey.failed.values()),
            "fix ssh first (`trainfleet setup ssh`)",
        )
    local = code_hash(directory).get("sha256")
    targets, same = copy_targets({n.host: survey.facts[n.host] for n in cluster.nodes}, local)
    shared = [h for h in same if _code_hash(survey.facts[h]) != local]
    if shared:
        result.note(f"{fold_names(shared)} share storage with a node copied to: copied once")
    if not targets:
        result.checks = [verify.SYNC.label]
        result.findings = verify.findings(survey, verify.SYNC)
        return result
    nodes = [cluster.node(h) for h in targets]
    probe = run_on_nodes(nodes, ["sh", "-c", "command -v rsync"], timeout=30)
    methods = choose_method(method, {r.node: r.ok for r in probe})
    verb = "would copy" if dry_run else "copied"
    plan = [
        f"  {h}: {directory} ({methods[h]}{' --delete' if methods[h] == 'rsync' else ''})"
        for h in targets
    ]
    if dry_run:
        for host in targets:
            result.add(host, f"{verb} {directory} ({methods[host]})")
        return result
    if not confirm("\n".join([f"copy this machine's {directory} to:", *plan, "go ahead?"])):
        raise SetupError(
            "the copy was not confirmed; nothing was changed",
            "run again and answer yes, or pass --yes",
        )
    with ThreadPoolExecutor(max_workers=8) as pool:
        errors = dict(
            zip(
                targets,
                pool.map(lambda n: copy_to(n, directory, methods[n.host], excludes), nodes),
                strict=True,
            )
        )
    failed = {h: e for h, e in errors.items() if e}
    for host in targets:
        if host not in failed:
            result.add(host, f"{verb} {directory} ({methods[host]})")
    if failed:
        raise SetupError(
            "; ".join(f"{h}: {e}" for h, e in failed.items()),
            "check the path's permissions on those nodes",
        )
    survey = verify.survey(cluster, verify.SYNC)
    result.checks = [verify.SYNC.label]
    result.findings = verify.findings(survey, verify.SYNC)
    return result
