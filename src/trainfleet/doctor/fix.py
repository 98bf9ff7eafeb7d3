"""`doctor --fix`: the safe, reversible changes for what doctor found, shown before they are made.

    >>> plan = plan_fixes(report, cluster_file="cluster.yaml")  # doctest: +SKIP
    >>> print(render_plan(plan))  # doctest: +SKIP
    >>> apply_plan(plan)  # doctest: +SKIP

Three kinds of change, each undoable with one command that the plan prints or needing none:

- unknown host keys are added (never replaced) to the known_hosts file that failed, after their
  SHA256 fingerprints are shown; `ssh-keygen -R NAME -f FILE` takes one out again;
- the interface each node reaches the master through is pinned in cluster.yaml (`interface:`,
  from which launch sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on that node); an edited
  file keeps its comments and the old one is kept beside it;
- a torch JIT build lock a killed build left (`jit-lock-stale`) is removed, after the node
  checks again that no process builds there; torch creates it anew at its next build.

Nothing else is changed: a firewall is never opened (its finding carries the minimal rule), a
changed host key is never trusted, a process holding a port is never killed.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainfleet import clusterfile
from trainfleet import node as node_programs
from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport
from trainfleet.doctor.checks.software import stale_jit_locks
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.errors import ClusterFileError, NodeAnswerError, SpecError
from trainfleet.keyscan import fingerprint, keyscan, port_of, unknown_key_name
from trainfleet.node import files, jitlocks
from trainfleet.remote import Failure, run_on_nodes
from trainfleet.untrusted import printable, valid_interface

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
THIS_MACHINE = "this machine"
INTERFACE_FINDINGS = (FindingId.IFACE_MISMATCH, FindingId.IFACE_WRONG)


@dataclass(kw_only=True, slots=True)
class HostKeyFix:
    """Host keys of `peer` to add to `known_hosts` on `target` under `name`."""

    target: str
    """Node whose ssh failed (THIS_MACHINE for the launch machine)."""
    known_hosts: str
    name: str
    peer: str
    keys: list[str]
    """`type base64` lines as ssh-keyscan printed them."""

    @property
    def lines(self) -> list[str]:
        return [f"{self.name} {key}" for key in self.keys]


@dataclass(kw_only=True, slots=True)
class InterfaceFix:
    """cluster.yaml with `interface:` pinned on the nodes that need it."""

    path: str
    text: str
    interfaces: dict[str, str]
    backup: str | None
    """Where the old file goes (None: a new file)."""


@dataclass(kw_only=True, slots=True)
class JitLockFix:
    """Stale torch JIT build locks to remove on `node`."""

    node: str
    paths: list[str]
    extensions_dir: str | None
    """The node's TORCH_EXTENSIONS_DIR in cluster.yaml, where its probe looked too."""


@dataclass(kw_only=True, slots=True)
class FixPlan:
    host_keys: list[HostKeyFix] = field(default_factory=list)
    interfaces: InterfaceFix | None = None
    jit_locks: list[JitLockFix] = field(default_factory=list)
    not_done: list[str] = field(default_factory=list)
    """Problems --fix leaves to the user, and why."""

    @property
    def changes(self) -> int:
        return len(self.host_keys) + (1 if self.interfaces else 0) + len(self.jit_locks)

    def to_json(self) -> dict:
        return {
            "host_keys": [
                {
                    "target": k.target,
                    "known_hosts": k.known_hosts,
                    "name": k.name,
                    "peer": k.peer,
                    "fingerprints": [fingerprint(key) for key in k.keys],
                }
                for k in self.host_keys
            ],
            "interfaces": {"path": self.interfaces.path, "nodes": self.interfaces.interfaces}
            if self.interfaces
            else None,
            "jit_locks": {fix.node: fix.paths for fix in self.jit_locks},
            "not_done": self.not_done,
        }


# ----------------------------------------------------------------------------- host keys
def _unknown_keys(report: DoctorReport, plan: FixPlan) -> list[tuple[str, str, str, str]]:
    """(target, known_hosts file, name, peer) for every ssh that failed on an unknown key. A
    destination a node reports that is not a node of the cluster is left out, with a note."""
    survey = report.survey
    if survey is None:
        return []
    nodes = {node.host: node for node in survey.cluster.nodes}
    found = []
    for host, result in survey.failed.items():
        name = unknown_key_name(result.stderr)
        if result.failure is Failure.HOSTKEY_UNKNOWN and name:
            known = nodes[host].ssh.known_hosts_file or DEFAULT_KNOWN_HOSTS
            found.append((THIS_MACHINE, known, name, host))
    for src, facts in survey.facts.items():
        for dst, outcome in facts.active.ssh.items():
            name = unknown_key_name(outcome.stderr)
            if not name or dst in survey.failed:
                continue
            if dst not in nodes:  # the node's own word: no key is scanned or added for it
                plan.not_done.append(
                    f"host key of {dst[:60]!r}: {src} reports an ssh to it, but it is not a"
                    " node of this cluster; ignored"
                )
                continue
            known = nodes[dst].ssh.known_hosts_file or DEFAULT_KNOWN_HOSTS
            found.append((src, known, name, dst))
    return found


def plan_host_keys(report: DoctorReport, plan: FixPlan) -> None:
    survey = report.survey
    scanned: dict[tuple[str, int], list[str]] = {}
    for target, known, name, peer in _unknown_keys(report, plan):
        address = survey.addresses.get(peer) if survey else None
        if not address:
            plan.not_done.append(f"host key of {peer}: its address is unknown here")
            continue
        where = (address, port_of(name))
        if where not in scanned:
            scanned[where] = keyscan(*where)
        if not scanned[where]:
            plan.not_done.append(f"host key of {peer}: ssh-keyscan {address} got no answer")
            continue
        plan.host_keys.append(
            HostKeyFix(target=target, known_hosts=known, name=name, peer=peer, keys=scanned[where])
        )


# ----------------------------------------------------------------------------- interfaces
def plan_interfaces(report: DoctorReport, cluster_file: str | None, plan: FixPlan) -> None:
    survey = report.survey
    if survey is None:
        return
    interfaces = {}
    for finding in report.findings:
        if finding.id not in INTERFACE_FINDINGS or finding.severity is Severity.INFO:
            continue
        for host in finding.nodes:
            summary = report.nodes.get(host)
            chosen = summary.interface if summary else None
            if chosen and not valid_interface(chosen):  # a node's own word: never written
                plan.not_done.append(
                    f"interface of {host}: it reports {str(chosen)[:60]!r}, not an interface name"
                )
            elif chosen and survey.cluster.node(host).interface != chosen:
                interfaces[host] = chosen
    if not interfaces:
        return
    pins = {host: clusterfile.NodeEdit(interface=iface) for host, iface in interfaces.items()}
    if cluster_file:
        text = Path(cluster_file).read_text()
        try:
            edited = clusterfile.edit(text, cluster_file, nodes=pins)
        except (ClusterFileError, SpecError) as exc:
            plan.not_done.append(f"interfaces: {exc}")
            return
        backup = clusterfile.backup_name(cluster_file)
        plan.interfaces = InterfaceFix(
            path=cluster_file, text=edited, interfaces=interfaces, backup=backup
        )
        return
    path = "cluster.yaml"
    if Path(path).exists():
        plan.not_done.append(
            f"interfaces: ./{path} exists and was not given with -c; not overwritten"
        )
        return
    try:
        text = clusterfile.new(survey.cluster, nodes=pins, written_by="trainfleet doctor --fix")
    except (ClusterFileError, SpecError) as exc:
        plan.not_done.append(f"interfaces: {exc}")
        return
    plan.interfaces = InterfaceFix(path=path, text=text, interfaces=interfaces, backup=None)


# ----------------------------------------------------------------------------- JIT locks
def plan_jit_locks(report: DoctorReport, plan: FixPlan) -> None:
    if report.survey is None:
        return
    by_node: dict[str, list[str]] = {}
    for host, lock in stale_jit_locks(report.survey):
        by_node.setdefault(host, []).append(lock.path)
    for host, paths in by_node.items():
        extensions_dir = report.survey.cluster.node(host).env.get("TORCH_EXTENSIONS_DIR")
        plan.jit_locks.append(JitLockFix(node=host, paths=paths, extensions_dir=extensions_dir))


def remove_jit_locks(fix: JitLockFix, cluster: Cluster) -> list[str]:
    """The node removes each lock that is still stale; one line per lock."""
    node = cluster.node(fix.node)
    job = jitlocks.RemoveJob(paths=fix.paths, extensions_dir=fix.extensions_dir)
    argv = node_programs.argv(node.python, jitlocks.remove_main)
    [result] = run_on_nodes([node], argv, stdin=node_programs.line(jitlocks.remove_main, job),
                            timeout=30)  # fmt: skip
    outcome: dict = {}
    failed = "failed: " + result.reason()
    if result.ok:
        failed = "failed: the node did not say"
        try:
            answer = node_programs.read_answer(result.stdout, jitlocks.RemoveAnswer, node=fix.node)
        except NodeAnswerError as exc:
            failed = f"failed: {exc.problem}"
        else:
            outcome = answer["outcome"] if isinstance(answer["outcome"], dict) else {}
    said = {path: printable(str(outcome.get(path, failed)))[:200] for path in fix.paths}
    return [f"{fix.node}: {path}: {said[path]}" for path in fix.paths]


# ----------------------------------------------------------------------------- plan, apply
_NEVER = {
    FindingId.FIREWALL_BLOCKS_PORTS: "doctor never changes a firewall; the rule to add is above",
    FindingId.SSH_HOSTKEY_CHANGED: "a changed host key may be an attack; check it, then remove "
    "the old entry yourself",
    FindingId.PORT_IN_USE: "doctor never kills a process",
}


def plan_fixes(report: DoctorReport, *, cluster_file: str | None = None) -> FixPlan:
    """What --fix would change for `report`, and what it leaves to the user (scans host keys)."""
    plan = FixPlan()
    plan_host_keys(report, plan)
    plan_interfaces(report, cluster_file, plan)
    plan_jit_locks(report, plan)
    fixed = {FindingId.SSH_HOSTKEY_UNKNOWN} if plan.host_keys else set()
    if plan.interfaces:
        fixed.update(INTERFACE_FINDINGS)
    if plan.jit_locks:
        fixed.add(FindingId.JIT_LOCK_STALE)
    for finding in report.findings:
        if finding.severity is not Severity.INFO and finding.id not in fixed:
            plan.not_done.append(_left(finding))
    return plan


def _left(finding: Finding) -> str:
    why = _NEVER.get(finding.id, "not a change --fix makes; see its fix above")
    # A finding may name what a node reported (an ssh destination): never raw to the terminal.
    nodes = ", ".join(printable(node)[:60] for node in finding.nodes)
    return f"{finding.id} [{nodes or THIS_MACHINE}]: {why}"


def render_plan(plan: FixPlan) -> str:
    if not plan.changes:
        lines = ["doctor --fix: nothing it can change safely."]
    else:
        lines = [f"doctor --fix will make {plan.changes} change(s):"]
    for fix in plan.host_keys:
        lines.append(
            f"  add {fix.peer}'s host key(s) as {fix.name} to {fix.known_hosts} on {fix.target}:"
        )
        lines += [f"      {fingerprint(key)}" for key in fix.keys]
        lines.append(f"    undo: ssh-keygen -R '{fix.name}' -f {fix.known_hosts}")
    if plan.interfaces:
        pins = ", ".join(f"{h}: {i}" for h, i in plan.interfaces.interfaces.items())
        verb = "edit" if plan.interfaces.backup else "write a new"
        lines.append(f"  {verb} {plan.interfaces.path}: pin interface per node ({pins})")
        if plan.interfaces.backup:
            lines.append(
                f"    undo: mv {plan.interfaces.backup} {plan.interfaces.path} (the old file)"
            )
        else:
            lines.append(f"    undo: rm {plan.interfaces.path}; then pass it with -c")
    for locks in plan.jit_locks:
        lines.append(f"  remove torch's stale JIT build lock(s) on {locks.node}:")
        lines += [f"      {path}" for path in locks.paths]
        lines.append("    undo: none needed (torch creates the lock anew at its next build)")
    if plan.not_done:
        lines.append("left to you:")
        lines += [f"  {item}" for item in plan.not_done]
    return "\n".join(lines)


def _appended(stdout: str, host: str) -> str:
    """How many lines `files.append_lines` says it added on `host`, or why it said nothing."""
    try:
        return str(node_programs.read_answer(stdout, files.AppendAnswer, node=host)["added"])
    except NodeAnswerError as exc:
        return f"failed: {exc.problem}"


def _append_here(path: str, lines: list[str]) -> str:
    job = node_programs.line(files.append_lines, files.AppendJob(file=path, lines=lines))
    done = subprocess.run(
        node_programs.argv(sys.executable, files.append_lines),
        input=job,
        capture_output=True,
        check=False,
    )
    err = done.stderr.decode(errors="replace").strip()
    if done.returncode != 0:
        return f"failed: {err}"
    return _appended(done.stdout.decode(), THIS_MACHINE)


def apply_plan(plan: FixPlan, cluster: Cluster) -> list[str]:
    """Make the planned changes; one line per change saying what happened."""
    done = []
    for fix in plan.host_keys:
        if fix.target == THIS_MACHINE:
            outcome = _append_here(fix.known_hosts, fix.lines)
        else:
            node = cluster.node(fix.target)
            job = files.AppendJob(file=fix.known_hosts, lines=fix.lines)
            [result] = run_on_nodes(
                [node],
                node_programs.argv(node.python, files.append_lines),
                stdin=node_programs.line(files.append_lines, job),
                timeout=30,
            )
            outcome = (
                _appended(result.stdout, node.host) if result.ok else f"failed: {result.reason()}"
            )
        done.append(f"{fix.target}: {fix.known_hosts}: {outcome} line(s) added for {fix.name}")
    if plan.interfaces:
        pinned = plan.interfaces
        clusterfile.save(pinned.path, pinned.text, backup=pinned.backup)
        if pinned.backup:
            done.append(f"{pinned.path}: interfaces pinned (old file: {pinned.backup})")
        else:
            done.append(f"{pinned.path}: written; pass it with -c {pinned.path}")
    for locks in plan.jit_locks:
        done += remove_jit_locks(locks, cluster)
    return done
