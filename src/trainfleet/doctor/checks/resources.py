"""Resource checks: GPUs, shared memory, disk, clocks, InfiniBand limits, shared storage.

>>> check_shm(survey)  # doctest: +SKIP
"""

from __future__ import annotations

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.findings import Finding, Severity

GIB = 1 << 30
MIN_SHM = 1 * GIB
MIN_DISK = 20 * GIB
MAX_CLOCK_SKEW_S = 2.0


def check_gpus(survey: Survey) -> list[Finding]:
    findings = []
    for host, facts in survey.facts.items():
        devices = facts.gpus.devices if facts.gpus else ()
        node = survey.cluster.node(host)
        slots = node.slots
        # A Slurm job's slots are what Slurm gave it: `slurm.check_gpus` compares them.
        if devices and len(devices) < slots and node.slurm is None:
            findings.append(
                Finding(
                    id=FindingId.GPU_COUNT_MISMATCH,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"{host} has {len(devices)} GPU(s) but slots={slots}"],
                    fix=f"set slots={len(devices)} for {host} in the hostfile / cluster.yaml",
                )
            )
        busy = facts.gpus.processes if facts.gpus else ()
        if busy:
            findings.append(
                Finding(
                    id=FindingId.GPU_BUSY,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[f"{host}: pid {p.pid} {p.name} uses {p.used_mib} MiB" for p in busy],
                    fix=f"stop the leftover processes on {host} (`kill PID`) before launching",
                )
            )
    return findings


def check_shm(survey: Survey) -> list[Finding]:
    small = {
        host: facts.shm.total
        for host, facts in survey.facts.items()
        if facts.shm.total is not None and facts.shm.total < MIN_SHM
    }
    return [
        Finding(
            id=FindingId.SHM_SMALL,
            severity=Severity.WARNING,
            nodes=(host,),
            evidence=[
                f"/dev/shm on {host} is {size / GIB:.2f} GiB (NCCL needs more in containers)"
            ],
            fix="run the container with `--shm-size=16g` (or remount /dev/shm larger)",
        )
        for host, size in small.items()
    ]


def check_disk(survey: Survey) -> list[Finding]:
    findings = []
    for host, facts in survey.facts.items():
        disk = facts.workdir.disk
        if disk.free is not None and disk.free < MIN_DISK:
            findings.append(
                Finding(
                    id=FindingId.DISK_LOW,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[f"{disk.free / GIB:.1f} GiB free at {facts.workdir.path} on {host}"],
                    fix="write checkpoints elsewhere, or keep fewer of them",
                )
            )
    return findings


def check_memlock(survey: Survey) -> list[Finding]:
    findings = []
    for host, facts in survey.facts.items():
        memlock = facts.limits.memlock
        if facts.infiniband and memlock is not None:
            findings.append(
                Finding(
                    id=FindingId.IB_MEMLOCK,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[f"{host} has InfiniBand devices and `ulimit -l` = {memlock} bytes"],
                    fix="`* - memlock unlimited` in /etc/security/limits.conf (then log in again), "
                    "or `--ulimit memlock=-1` for containers",
                )
            )
    return findings


def check_clocks(survey: Survey, started: float, finished: float) -> list[Finding]:
    findings = []
    for host, facts in survey.facts.items():
        t = facts.time
        if t is None:
            continue
        skew = max(started - t, t - finished, 0.0)
        if skew > MAX_CLOCK_SKEW_S:
            findings.append(
                Finding(
                    id=FindingId.CLOCK_SKEW,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[f"{host}'s clock is {skew:.1f} s off this machine's"],
                    fix="run NTP (chrony/systemd-timesyncd) on every node",
                )
            )
    return findings


def check_shared_storage(survey: Survey) -> list[Finding]:
    apart = []
    wrote = {h for h, f in survey.facts.items() if f.active.token == "written"}
    for host, facts in survey.facts.items():
        for peer, seen in facts.active.shared.items():
            if not seen and peer in wrote:
                apart.append(f"{host} does not see {peer}'s file in the working directory")
    if not apart:
        return []
    return [
        Finding(
            id=FindingId.SHARED_DIR_MISSING,
            severity=Severity.INFO,
            nodes=tuple(survey.facts),
            evidence=apart[:8],
            fix="no shared storage: code, data and checkpoints must be copied to every node",
        )
    ]
