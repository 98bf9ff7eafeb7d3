"""`trainfleet setup hosts`: the /etc/hosts lines that name the IPv4-mapped addresses c10d looks
up, on the nodes where doctor finds them missing (its `hostname-unresolvable` warning about
`err=-3`); recorded, so that `--revert` removes exactly those lines.

    >>> hosts_line("10.0.0.12", "gpu-node-2")
    '::ffff:10.0.0.12\\tgpu-node-2-ipv4-mapped\\t# trainfleet setup hosts'
    >>> is_ours("::1 localhost")
    False

Where a cluster's resolver never answers, every process that joins a launch waits out one
reverse lookup (glibc's 5 s x 2 tries by default) before it connects: torch names the store's
address in its IPv4-mapped form, which /etc/hosts does not list, so the question goes to DNS.
The lines give each such address a name of its own (`NAME-ipv4-mapped`: the node's own name
keeps resolving to its IPv4 address alone). Nothing else in /etc/hosts is touched; the file
is edited in place (it is often a bind mount).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.doctor.checks import network
from trainfleet.doctor.collect import Survey
from trainfleet.errors import NodeAnswerError, SetupError
from trainfleet.node import files
from trainfleet.remote import run_on_nodes
from trainfleet.setup import verify
from trainfleet.setup.firewall.record import save_state
from trainfleet.setup.result import Confirm, SetupResult

TAG = "# trainfleet setup hosts"
HOSTS_FILE = "/etc/hosts"
TIMEOUT_S = 30
_OURS = re.compile(
    r"::ffff:(\d{1,3}(?:\.\d{1,3}){3})\t([A-Za-z0-9][A-Za-z0-9.-]{0,250})\t" + re.escape(TAG)
)


def hosts_line(address: str, host: str) -> str:
    return f"::ffff:{address}\t{network.mapped_name(host, address)}\t{TAG}"


def is_ours(line: object) -> bool:
    """A line `setup hosts` writes (what --revert may remove)."""
    return isinstance(line, str) and _OURS.fullmatch(line) is not None


def plan_lines(survey: Survey) -> dict[str, list[str]]:
    """Per node, the lines doctor's facts call for: one per IPv4-mapped address it could not
    name."""
    node_of = {address: host for host, address in survey.addresses.items() if address}
    return {
        host: [hosts_line(a, node_of.get(a, a)) for a in sorted(lookups)]
        for host, lookups in network.unnamed_mapped(survey).items()
    }


def default_state_file(cluster_in: str | None) -> str:
    if cluster_in:
        return f"{cluster_in}.hosts.json"
    return str(Path.home() / ".trainfleet" / "hosts.json")


def load_state(path: str, *, must_exist: bool = False) -> dict:
    """The state file, checked: every line in it must be one this step writes, so that an
    edited file cannot make --revert remove anything else."""
    try:
        state = json.loads(Path(path).read_text())
    except FileNotFoundError:
        if must_exist:
            raise SetupError(
                f"{path}: no hosts state file, so nothing recorded to revert",
                "pass the --state FILE that `setup hosts` used (it names it when it adds lines);"
                f" without it, remove the lines ending in `{TAG}` by hand",
            ) from None
        return {"version": 1, "file": HOSTS_FILE, "nodes": {}}
    except ValueError as exc:
        raise SetupError(f"{path} is not a hosts state file ({exc})", "check the path") from None
    nodes = state.get("nodes") if isinstance(state, dict) else None
    if not isinstance(nodes, dict) or state.get("file") != HOSTS_FILE:
        raise SetupError(f"{path} is not a hosts state file", "check the path")
    for host, lines in nodes.items():
        bad = [line for line in lines if not is_ours(line)] if isinstance(lines, list) else [lines]
        if bad:
            raise SetupError(
                f"{path}: {host} lists a line `setup hosts` does not write: {str(bad[0])[:120]!r}",
                "nothing was changed; restore the file `setup hosts` wrote, or remove the lines "
                f"ending in `{TAG}` by hand",
            )
    return state


def _edit(
    cluster: Cluster, jobs: dict[str, files.HostsJob]
) -> tuple[dict[str, files.HostsAnswer], list[str]]:
    """The node job `files.edit_hosts` on each node (with `sudo -n` where the login is not
    root): its checked answer per node, and what failed."""
    from trainfleet.setup.firewall.apply import sudo_prefixes

    nodes = [cluster.node(h) for h in jobs]
    sudo = sudo_prefixes(nodes)
    argv = {h: sudo[h] + node_programs.argv(verify.PROBE_PYTHON, files.edit_hosts) for h in jobs}
    stdin = {h: node_programs.line(files.edit_hosts, job) for h, job in jobs.items()}
    answers, failed = {}, []
    for r in run_on_nodes(nodes, argv, stdin=stdin, timeout=TIMEOUT_S):
        answer = _answer(r.stdout, jobs[r.node], r.node) if r.ok else None
        if answer is None:
            why = r.reason() if not r.ok else "its answer is not the lines it was asked about"
            failed.append(f"{r.node}: {why}")
        else:
            answers[r.node] = answer
    return answers, failed


def _answer(stdout: str, job: files.HostsJob, host: str) -> files.HostsAnswer | None:
    """The node's answer where it speaks only of the lines it was asked about; else None."""
    try:
        answer = node_programs.read_answer(stdout, files.HostsAnswer, node=host)
    except NodeAnswerError:
        return None
    for said, asked in ((answer["added"], job["add"]), (answer["removed"], job["remove"])):
        if not isinstance(said, list) or not set(said) <= set(asked):
            return None
    return answer


def setup_hosts(
    cluster: Cluster,
    *,
    revert: bool = False,
    state_file: str | None = None,
    cluster_in: str | None = None,
    confirm: Confirm,
    dry_run: bool = False,
) -> SetupResult:
    """Add the lines doctor's facts call for (after `confirm`), or with `revert` remove what
    was recorded; ends with doctor's check of the names."""
    state_file = state_file or default_state_file(cluster_in)
    result = SetupResult(step="hosts", dry_run=dry_run)
    check = verify.HOSTS
    if revert:
        result.fail_at = None  # the warning is expected back: it is what --revert restores
        state = load_state(state_file, must_exist=True)
        unknown = [h for h in state["nodes"] if h not in {n.host for n in cluster.nodes}]
        if unknown:
            raise SetupError(
                f"{state_file} lists {', '.join(unknown)}, not in this cluster",
                "pass the same cluster as when the lines were added",
            )
        if dry_run:
            for host, lines in state["nodes"].items():
                for line in lines:
                    result.add(host, f"would remove from {HOSTS_FILE}: {_shown(line)}")
            return result
        jobs = {
            h: files.HostsJob(file=HOSTS_FILE, add=[], remove=ls)
            for h, ls in state["nodes"].items()
            if ls
        }
        answers, failed = _edit(cluster, jobs)
        for host, answer in answers.items():
            for line in jobs[host]["remove"]:
                if line not in answer["removed"]:
                    result.note(f"{host}: already gone: {_shown(line)}")
            for line in answer["removed"]:
                result.add(host, f"removed from {HOSTS_FILE}: {_shown(line)}")
            state["nodes"][host] = []
        save_state(state_file, state)
        if failed:
            raise SetupError("; ".join(failed), f"the lines not removed stay in {state_file}")
    else:
        survey = verify.survey(cluster, check, probe_python=verify.PROBE_PYTHON)
        planned = plan_lines(survey)
        if dry_run or not planned:
            for host, lines in planned.items():
                for line in lines:
                    result.add(host, f"would add to {HOSTS_FILE}: {_shown(line)}")
            result.checks, result.findings = [check.label], verify.findings(survey, check)
            return result
        shown = [f"  {h}: {_shown(line)}" for h, lines in planned.items() for line in lines]
        question = f"lines to add to {HOSTS_FILE} (c10d's names for IPv4-mapped addresses):"
        if not confirm("\n".join([question, *shown, "add them?"])):
            raise SetupError(
                "the /etc/hosts lines were not confirmed; nothing was changed",
                "run again and answer yes, or pass --yes",
            )
        state = load_state(state_file)
        state["cluster"] = cluster.source
        answers, failed = _edit(cluster, {h: files.HostsJob(file=HOSTS_FILE, add=ls, remove=[])
                                          for h, ls in planned.items()})  # fmt: skip
        for host, answer in answers.items():
            recorded = state["nodes"].setdefault(host, [])
            recorded += [line for line in answer["added"] if line not in recorded]
            for line in answer["added"]:
                result.add(host, f"added to {HOSTS_FILE}: {_shown(line)}")
            there = [line for line in planned[host] if line not in answer["added"]]
            for line in there:
                result.note(f"{host}: already there (not recorded, so never removed): "
                            f"{_shown(line)}")  # fmt: skip
        save_state(state_file, state)
        if result.changes:
            result.note(f"recorded in {state_file}; `trainfleet setup hosts --revert` removes "
                        "exactly those lines")  # fmt: skip
        if failed:
            raise SetupError(
                "; ".join(failed),
                f"what was added is recorded in {state_file}; `trainfleet setup hosts --revert`"
                " removes it. Adding lines to /etc/hosts takes root (or `sudo -n` without a"
                " password)",
            )
    survey = verify.survey(cluster, check, probe_python=verify.PROBE_PYTHON)
    result.checks, result.findings = [check.label], verify.findings(survey, check)
    return result


def _shown(line: str) -> str:
    return line.removesuffix("\t" + TAG).replace("\t", " ")
