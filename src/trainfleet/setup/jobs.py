"""Run `trainfleet.node.sshkeys` on nodes over BatchMode ssh and read back its JSON, one result
per node.

>>> JOB_ARGV[:3]
['python3', '-u', '-c']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from trainfleet import node as node_programs
from trainfleet.cluster import Node
from trainfleet.errors import SetupError
from trainfleet.nodeset import fold_names
from trainfleet.remote import NodeResult, run_on_nodes
from trainfleet.setup import hostkeys, verify

JOB_TIMEOUT_S = 60
JOB_ARGV = node_programs.argv(verify.PROBE_PYTHON, "sshkeys")
"""A stdlib python3 reads the job from stdin: nodes need nothing else installed."""


def job_line(job: dict) -> bytes:
    """What JOB_ARGV reads first on stdin: the trust job `job`."""
    return node_programs.line("sshkeys", "run", job)


def _job_failed(results: Sequence[NodeResult]) -> SetupError:
    missing = [r.node for r in results if r.returncode == 127 or "python3: " in r.stderr]
    if missing:
        return SetupError(
            f"{fold_names(missing)}: no python3 on the non-interactive PATH",
            "install python3 there (setup and doctor need only its standard library)",
        )
    detail = "; ".join(f"{r.node}: {r.reason()}" for r in results)
    return SetupError(f"the setup job failed on {detail}", results[0].failure.fix(results[0].node))


def run_jobs(nodes: Sequence[Node], jobs: Mapping[str, dict]) -> dict[str, dict]:
    """The trust job on each node (BatchMode ssh); its JSON result per node."""
    if not nodes:
        return {}
    payloads = {host: job_line(job) for host, job in jobs.items()}
    results = run_on_nodes(nodes, JOB_ARGV, stdin=payloads, timeout=JOB_TIMEOUT_S)
    failed = [r for r in results if not r.ok]
    if failed:
        raise _job_failed(failed)
    return {r.node: json.loads(r.stdout.strip().splitlines()[-1]) for r in results}


def node_job(node: Node, **fields) -> dict:
    return {
        "identity": node.ssh.identity_file,
        "known_hosts": node.ssh.known_hosts_file,
        "ssh_g": hostkeys.ssh_g_argv(node),
        **fields,
    }
