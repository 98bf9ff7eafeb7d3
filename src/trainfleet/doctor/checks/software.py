"""Software checks: paths, versions, the non-interactive environment, the code itself.

>>> check_versions(survey)  # doctest: +SKIP
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections import Counter

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import Imports, JitLock, NodeFacts
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.node.jitlocks import JIT_LOCK_STALE_S
from trainfleet.nodeset import fold_names
from trainfleet.remote import Failure, NodeResult

# Versions that must match for collectives to work at all; the others only warn.
_MUST_MATCH = ("python", "torch", "nccl", "deepspeed")
_SHOULD_MATCH = ("transformers", "accelerate")
_TOOLS = ("torchrun", "deepspeed", "ninja", "nvcc")

NON_INTERACTIVE_FIX = (
    "activate the environment for non-interactive ssh too (before the early `return` in "
    "~/.bashrc), or set PATH in cluster.yaml `env:` (`trainfleet launch` also passes this "
    "machine's PATH to every node)"
)


def python_missing(result: NodeResult) -> bool:
    """The probe could not start: the node's python is not there (a finding, not a crash)."""
    missing = result.returncode == 127 or "No such file or directory" in result.stderr
    return result.failure is Failure.COMMAND_FAILED and missing


def check_paths(survey: Survey) -> list[Finding]:
    findings = []
    for host, result in survey.failed.items():
        if python_missing(result):
            node = survey.cluster.node(host)
            findings.append(
                Finding(
                    id=FindingId.REMOTE_PATH_MISSING,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"python {node.python} cannot be run on {host}: {result.reason()}"],
                    fix=f"install the same environment at {node.python} on {host}, or set that "
                    "node's `python:` in cluster.yaml",
                )
            )
    for host, facts in survey.facts.items():
        workdir = facts.workdir
        if workdir.exists is False:
            findings.append(
                Finding(
                    id=FindingId.REMOTE_PATH_MISSING,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"working directory {workdir.path} does not exist on {host}"],
                    fix="use the same layout on every node (or shared storage), or set `workdir:` "
                    "in cluster.yaml",
                )
            )
    return findings


def node_versions(facts: NodeFacts) -> dict[str, str | None]:
    """The versions that matter: torch's and NCCL's as importing torch reported them (full
    mode), else from package metadata, as every other package's."""
    packages = facts.packages
    imported = facts.imports or Imports()
    python = facts.python.version or ""
    return {
        "python": ".".join(python.split(".")[:2]) or None,
        "torch": imported.torch or packages.torch,
        "nccl": imported.nccl or packages.nccl_wheel,
        "deepspeed": packages.deepspeed,
        "transformers": packages.transformers,
        "accelerate": packages.accelerate,
    }


def check_versions(survey: Survey) -> list[Finding]:
    findings = []
    versions = {host: node_versions(facts) for host, facts in survey.facts.items()}
    for key in (*_MUST_MATCH, *_SHOULD_MATCH):
        seen = {host: version for host, v in versions.items() if (version := v[key])}
        if len(set(seen.values())) <= 1:
            continue
        common, _ = Counter(seen.values()).most_common(1)[0]
        odd = tuple(h for h, v in seen.items() if v != common)
        by_version: dict[str, list[str]] = {}
        for host, version in seen.items():
            by_version.setdefault(version, []).append(host)
        findings.append(
            Finding(
                id=FindingId.VERSION_MISMATCH,
                severity=Severity.ERROR if key in _MUST_MATCH else Severity.WARNING,
                nodes=odd,
                evidence=[f"{key} {v} on {fold_names(hosts)}" for v, hosts in by_version.items()],
                fix=f"install the same {key} on every node (same environment image everywhere)",
            )
        )
    return findings


def check_torch(survey: Survey) -> list[Finding]:
    findings = []
    has_torch = {h: bool(node_versions(f)["torch"]) for h, f in survey.facts.items()}
    for host, facts in survey.facts.items():
        imported = facts.imports or Imports()
        error = imported.torch_error or imported.import_error
        python = facts.python.executable
        if error:
            findings.append(
                Finding(
                    id=FindingId.TORCH_MISSING,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"`import torch` with {python} on {host} fails: {error}"],
                    fix=f"reinstall torch in {python} on {host}",
                )
            )
        elif not has_torch[host] and any(has_torch.values()):
            findings.append(
                Finding(
                    id=FindingId.TORCH_MISSING,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[
                        f"torch is not installed for {python} on {host} (other nodes have it)"
                    ],
                    fix=f"install torch into {python} on {host}, or point that node's `python:` "
                    "in cluster.yaml at the environment that has it",
                )
            )
    if survey.facts and not any(has_torch.values()):
        findings.append(
            Finding(
                id=FindingId.TORCH_MISSING,
                severity=Severity.WARNING,
                nodes=tuple(survey.facts),
                evidence=["torch is not installed for the configured python on any node"],
                fix="install the training environment (`pip install 'trainfleet[train]'`) on every "
                "node, or set `python:` in cluster.yaml",
            )
        )
    return findings


def check_tools(survey: Survey) -> list[Finding]:
    """Tools present on some nodes (or this one) but missing on a node's non-interactive PATH."""
    findings = []
    for host, facts in survey.facts.items():
        tools = facts.tools
        versions = node_versions(facts)
        if versions["deepspeed"] and not tools.get("ninja"):
            findings.append(
                Finding(
                    id=FindingId.NINJA_MISSING,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"deepspeed is installed on {host} but `ninja` is not on its "
                        "non-interactive PATH: JIT-built ops fail with `Ninja is required`"
                    ],
                    fix=f"`{facts.python.executable} -m pip install ninja` on {host}",
                )
            )
    findings += _path_differences(survey)
    for tool in _TOOLS:
        present = {h for h, f in survey.facts.items() if f.tools.get(tool)}
        here = shutil.which(tool) is not None
        lacking = [h for h in survey.facts if h not in present]
        if lacking and (present or here):
            where = fold_names(present) if present else "this machine"
            findings.append(
                Finding(
                    id=FindingId.REMOTE_ENV_DIFFERS,
                    severity=Severity.WARNING,
                    nodes=tuple(lacking),
                    evidence=[
                        f"`{tool}` is on the PATH of {where} but not on the non-interactive "
                        f"PATH of {fold_names(lacking)} (ssh runs no login shell)"
                    ],
                    fix=NON_INTERACTIVE_FIX,
                )
            )
    return findings


def check_code(survey: Survey) -> list[Finding]:
    hashes = {h: f.code.sha256 for h, f in survey.facts.items() if f.code and f.code.sha256}
    if len(set(hashes.values())) <= 1:
        return []
    common, _ = Counter(hashes.values()).most_common(1)[0]
    odd = tuple(h for h, v in hashes.items() if v != common)
    workdir = next(iter(survey.facts.values())).workdir.path
    return [
        Finding(
            id=FindingId.CODE_DIFFERS,
            severity=Severity.ERROR,
            nodes=odd,
            evidence=[
                f"the code under {workdir} differs on {fold_names(odd)} from the other nodes"
            ],
            fix="copy the same code to every node (rsync, git checkout of one commit) or use "
            "shared storage: different code hangs in mismatched collectives",
        )
    ]


def check_gpu_software(survey: Survey) -> list[Finding]:
    findings = []
    for host, facts in survey.facts.items():
        devices = facts.gpus.devices if facts.gpus else ()
        if devices and not facts.cuda_home and not facts.tools.get("nvcc"):
            findings.append(
                Finding(
                    id=FindingId.CUDA_HOME_MISSING,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"{host} has GPUs but neither CUDA_HOME nor nvcc on its "
                        "non-interactive PATH: DeepSpeed cannot build its ops there"
                    ],
                    fix=f"set CUDA_HOME for {host} in cluster.yaml env (e.g. /usr/local/cuda)",
                )
            )
    return findings


_LOCK_PATH = re.compile(r"/[^\x00-\x1f\x7f]*/lock")
"""An absolute path ending in /lock, on one line: what a node reports is shown, never trusted."""


def _jit_locks(facts: NodeFacts) -> list[JitLock]:
    """The node's lock reports whose path is a lock's (a hostile or broken node may report
    anything; the parser already dropped those of the wrong types)."""
    return [lock for lock in facts.jit_locks if _LOCK_PATH.fullmatch(lock.path)]


def stale_jit_locks(survey: Survey) -> list[tuple[str, JitLock]]:
    """(node, lock) for each JIT build lock older than jitlocks.JIT_LOCK_STALE_S that no process
    works under, on that node or on one that reports the same path (shared storage)."""
    reports = {host: _jit_locks(facts) for host, facts in survey.facts.items()}
    building = {lock.path for locks in reports.values() for lock in locks if lock.busy_pids}
    return [
        (host, lock)
        for host, locks in reports.items()
        for lock in locks
        if lock.path not in building and lock.age_s >= JIT_LOCK_STALE_S
    ]


def check_jit_locks(survey: Survey) -> list[Finding]:
    """A torch JIT build lock left by a killed build: every rank that loads that op waits for
    it forever, right after the rendezvous (where DeepSpeed builds or loads its ops)."""
    return [
        Finding(
            id=FindingId.JIT_LOCK_STALE,
            severity=Severity.ERROR,
            nodes=(host,),
            evidence=[
                f"{lock.path} on {host} is {lock.age_s / 60:.0f} min old and no process "
                "builds there: a killed build left it, and every rank that loads this op will "
                "wait for it forever"
            ],
            fix="`trainfleet doctor --fix` removes it (after checking again that no process "
            f"builds there), or `rm {shlex.quote(lock.path)}` on the node(s) named",
        )
        for host, lock in stale_jit_locks(survey)
    ]


def check_launcher(survey: Survey) -> list[Finding]:
    if shutil.which("pdsh") or len(survey.cluster.nodes) < 2:
        return []
    return [
        Finding(
            id=FindingId.PDSH_MISSING,
            severity=Severity.INFO,
            nodes=(),
            evidence=[
                "pdsh is not installed on this machine: DeepSpeed's runner cannot start nodes"
            ],
            fix="`apt-get install pdsh` if you launch with `deepspeed --hostfile`",
        )
    ]


def _path_differences(survey: Survey) -> list[Finding]:
    """Directories on every other node's non-interactive PATH but not on this one's."""
    paths = {h: [d for d in f.path.split(":") if d] for h, f in survey.facts.items()}
    findings = []
    for host, dirs in paths.items():
        others = [set(d) for h, d in paths.items() if h != host]
        if not others:
            continue
        missing = sorted(set.intersection(*others) - set(dirs))
        if missing:
            findings.append(
                Finding(
                    id=FindingId.REMOTE_ENV_DIFFERS,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"{host}'s non-interactive PATH lacks {', '.join(missing)} "
                        f"(PATH there: {':'.join(dirs)})"
                    ],
                    fix=NON_INTERACTIVE_FIX,
                )
            )
    return findings
