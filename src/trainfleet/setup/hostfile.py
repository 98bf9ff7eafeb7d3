"""`trainfleet setup hostfile`: slots from the GPUs each node really has; a hostfile and a
cluster.yaml that `launch`, `doctor` and DeepSpeed's runner read.

    >>> print(hostfile_text({"gpu-node-1": 8, "gpu-node-2": 8}), end="")
    # written by `trainfleet setup hostfile` (DeepSpeed/MPI format: HOST slots=N)
    gpu-node-1 slots=8
    gpu-node-2 slots=8
    >>> from trainfleet.doctor.facts import Gpu, Gpus, NodeFacts
    >>> slots_for({"a": NodeFacts(gpus=Gpus(devices=(Gpu(), Gpu()))), "b": NodeFacts(gpus=Gpus())},
    ...           cpu_slots=None)
    ({'a': 2, 'b': 1}, ['b: no GPU found; slots=1 (set --slots N for CPU nodes)'])

GPUs are counted by doctor's probe (nvidia-smi on each node); a node without GPUs gets
--slots (1 when not given, and the output says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainfleet import clusterfile
from trainfleet.cluster import Cluster, dshostfile, parse_cluster_yaml
from trainfleet.doctor.facts import NodeFacts
from trainfleet.errors import SetupError
from trainfleet.nodeset import fold_names
from trainfleet.setup import clusteryaml, verify
from trainfleet.setup.result import THIS_MACHINE, SetupResult, fold_notes

HEADER = "# written by `trainfleet setup hostfile` (DeepSpeed/MPI format: HOST slots=N)\n"


def hostfile_text(slots: dict[str, int]) -> str:
    """The hostfile `setup hostfile` writes: its header, then `cluster.dshostfile`'s lines."""
    return dshostfile.hostfile_text(slots, header=HEADER)


def slots_for(
    facts: Mapping[str, NodeFacts], cpu_slots: int | None
) -> tuple[dict[str, int], list[str]]:
    """Slots per node (GPU count, else `cpu_slots`, else 1) and notes on defaults filled in."""
    slots, notes = {}, []
    for host, sheet in facts.items():
        gpus = len(sheet.gpus.devices) if sheet.gpus else 0
        if gpus:
            slots[host] = gpus
            if cpu_slots is not None:
                notes.append(f"{host}: {gpus} GPU(s); --slots {cpu_slots} applies to CPU nodes")
        else:
            slots[host] = cpu_slots or 1
            if cpu_slots is None:
                notes.append(f"{host}: no GPU found; slots=1 (set --slots N for CPU nodes)")
    return slots, notes


def setup_hostfile(
    cluster: Cluster,
    *,
    hostfile_out: str,
    cluster_in: str | None = None,
    cluster_out: str | None = None,
    cpu_slots: int | None = None,
    dry_run: bool = False,
) -> SetupResult:
    """Count GPUs on every node; write the hostfile and the cluster.yaml with those slots."""
    if cpu_slots is not None and cpu_slots < 1:
        raise SetupError(f"--slots must be at least 1, got {cpu_slots}", "pass --slots N")
    result = SetupResult(step="hostfile", dry_run=dry_run)
    # Any stdlib python3 counts GPUs: the training environment may not be there yet.
    survey = verify.survey(cluster, verify.HOSTFILE, probe_python=verify.PROBE_PYTHON)
    if survey.failed:
        raise SetupError(
            f"cannot count the GPUs of {fold_names(survey.failed)}: "
            + "; ".join(r.reason() for r in survey.failed.values()),
            "fix ssh first (`trainfleet setup ssh`), then run this again",
        )
    facts = {node.host: survey.facts[node.host] for node in cluster.nodes}
    slots, notes = slots_for(facts, cpu_slots)
    result.notes += fold_notes(notes)

    text = hostfile_text(slots)
    old = Path(hostfile_out).read_text() if Path(hostfile_out).exists() else None
    if old != text:
        if not dry_run:
            Path(hostfile_out).write_text(text)
        verb = "would write" if dry_run else "wrote"
        shown = ", ".join(f"{h}={n}" for h, n in slots.items())
        result.add(THIS_MACHINE, f"{verb} {hostfile_out} ({shown})")
    result.files["hostfile"] = hostfile_out

    out = cluster_out or cluster_in or str(Path(hostfile_out).parent / "cluster.yaml")
    base, source = clusteryaml.base_text(
        cluster, cluster_in=cluster_in, out=out, written_by="trainfleet setup hostfile"
    )
    text = clusterfile.edit(base, source, nodes={h: {"slots": n} for h, n in slots.items()})
    done = clusterfile.write(out, text, dry_run=dry_run)
    if done:
        result.add(THIS_MACHINE, done)
    result.files["cluster"] = out

    survey.cluster = parse_cluster_yaml(text, out)  # doctor's check, on what was written
    result.checks = [verify.HOSTFILE.label]
    result.findings = verify.findings(survey, verify.HOSTFILE)
    return result
