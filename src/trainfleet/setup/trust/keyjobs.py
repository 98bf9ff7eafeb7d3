"""Run `trainfleet.node.sshkeys` on nodes over BatchMode ssh and read back its answer, one result
per node.

>>> JOB_ARGV[:3]
['python3', '-u', '-c']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainfleet import node as node_programs
from trainfleet.cluster import Node
from trainfleet.errors import NodeAnswerError, SetupError
from trainfleet.node import sshkeys
from trainfleet.nodeset import fold_names
from trainfleet.remote import NodeResult, run_on_nodes
from trainfleet.setup import verify
from trainfleet.setup.trust import hostkeys
from trainfleet.untrusted import printable, valid_key

JOB_TIMEOUT_S = 60
JOB_ARGV = node_programs.argv(verify.PROBE_PYTHON, sshkeys.run)
"""A stdlib python3 reads the job from stdin: nodes need nothing else installed."""


def job_line(job: sshkeys.TrustJob) -> bytes:
    """What JOB_ARGV reads first on stdin: the trust job (`sshkeys.job` builds one)."""
    return node_programs.line(sshkeys.run, job)


def _job_failed(results: Sequence[NodeResult]) -> SetupError:
    missing = [r.node for r in results if r.returncode == 127 or "python3: " in r.stderr]
    if missing:
        return SetupError(
            f"{fold_names(missing)}: no python3 on the non-interactive PATH",
            "install python3 there (setup and doctor need only its standard library)",
        )
    detail = "; ".join(f"{r.node}: {r.reason()}" for r in results)
    return SetupError(f"the setup job failed on {detail}", results[0].failure.fix(results[0].node))


def run_jobs(
    nodes: Sequence[Node], jobs: Mapping[str, sshkeys.TrustJob]
) -> dict[str, sshkeys.TrustAnswer]:
    """The trust job on each node (BatchMode ssh); its JSON result per node."""
    if not nodes:
        return {}
    payloads = {host: job_line(job) for host, job in jobs.items()}
    results = run_on_nodes(nodes, JOB_ARGV, stdin=payloads, timeout=JOB_TIMEOUT_S)
    failed = [r for r in results if not r.ok]
    if failed:
        raise _job_failed(failed)
    return {r.node: read_answer(r.node, r.stdout, jobs[r.node]) for r in results}


def read_answer(host: str, stdout: str, job: sshkeys.TrustJob) -> sshkeys.TrustAnswer:
    """The job's answer (`trainfleet.node.read_answer`), checked field by field: root on the
    node writes it, and its keys end up in every node's authorized_keys and known_hosts, its
    paths and names on the screen."""
    answer: sshkeys.TrustAnswer | None
    problem: str | None
    try:
        answer = node_programs.read_answer(stdout, sshkeys.TrustAnswer, node=host)
    except NodeAnswerError as exc:
        answer, problem = None, f"is missing or malformed ({exc.problem})"
    else:
        problem = _problem(answer, job)
    if problem or answer is None:
        raise SetupError(
            f"{host}: the setup job's answer {problem}",
            f"check that `{verify.PROBE_PYTHON}` there is a plain CPython and that ssh-keygen "
            "works there; this machine wrote nothing from that answer",
        )
    return answer


_TEXT = ("identity", "known_hosts", "authorized_keys")
"""Paths shown to the user and sent back to the node (its `hostname` is read elsewhere)."""
_FLAGS = ("key_created", "key_missing")
_COUNTS = ("known_added", "authorized_added")


def _problem(answer: sshkeys.TrustAnswer, job: sshkeys.TrustJob) -> str | None:
    """What is wrong with a trust job's answer (None: nothing)."""
    for field in _TEXT:
        text = answer.get(field)
        if not isinstance(text, str) or printable(text) != text or not 0 < len(text) <= 4096:
            return f"has no plain {field}"
    if any(not isinstance(answer.get(f), bool) for f in _FLAGS):
        return "has no key_created/key_missing flags"
    for f in _COUNTS:
        count = answer.get(f)
        if type(count) is not int or count < 0:
            return "has no counts of the lines it added"
    pubkey = answer.get("pubkey")
    if pubkey is not None and not (isinstance(pubkey, str) and valid_key(pubkey)):
        return f"holds a public key that is not exactly one key ({printable(str(pubkey))[:80]!r})"
    known = answer.get("known")
    asked = set(job["lookup"])
    if not isinstance(known, dict) or set(known) != asked:
        return "does not list the known keys of exactly the names asked for"
    for name, keys in known.items():
        if not isinstance(keys, list) or not all(isinstance(k, str) and valid_key(k) for k in keys):
            return f"lists known keys for {name} that are not keys"
    removed = answer.get("removed")
    if not isinstance(removed, list) or not set(removed) <= set(job["remove"]):
        return "says it removed names it was not asked to remove"
    return None


def node_job(node: Node, **fields: Any) -> sshkeys.TrustJob:
    """The trust job for `node` with its ssh settings, asking for `fields` too."""
    return sshkeys.job(
        identity=node.ssh.identity_file,
        known_hosts=node.ssh.known_hosts_file,
        ssh_g=hostkeys.ssh_g_argv(node),
        **fields,
    )
