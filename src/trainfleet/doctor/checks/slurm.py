"""Slurm's own failures, inside a job: a node of the job whose step does not run, trainfleet
started as several tasks of one step (N x N ranks), steps that do not inherit the job's
environment, a node showing another number of GPUs than the job was given.

    >>> job_tasks({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"})
    (2, 4, '0')
    >>> job_tasks({"SLURM_JOB_ID": "7"}) is None  # a batch script or salloc's shell
    True

Pure functions of the survey, as every check: the nodes' Slurm steps (`Node.slurm`) and the
variables Slurm set for trainfleet (`survey.launch_env`).
"""

from __future__ import annotations

from collections.abc import Mapping

from trainfleet.catalog import FindingId
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.findings import Finding, Severity


def _slurm_hosts(survey: Survey) -> list[str]:
    return [node.host for node in survey.cluster.nodes if node.slurm is not None]


def exclude_fix(host: str) -> str:
    return (
        f"resubmit without it: `sbatch --exclude={host}` (trainfleet: "
        f"--sbatch-arg=--exclude={host})"
    )


def check_unreachable(survey: Survey) -> list[Finding]:
    """A node of the job whose probe step failed or never started: Slurm's, not ssh's."""
    findings = []
    for host in _slurm_hosts(survey):
        result = survey.failed.get(host)
        if result is None:
            continue
        times = survey.times.get(host)
        if times is not None and times.bound is not None and times.started_s is None:
            why = f"its step had not started after {result.duration_s:.0f} s"
        else:
            why = f"its step failed: {result.reason()}"
        findings.append(
            Finding(
                id=FindingId.SLURM_NODE_UNREACHABLE,
                severity=Severity.ERROR,
                nodes=(host,),
                evidence=[f"srun --overlap --nodelist={host}: {why}"],
                fix=f"`scontrol show node {host}` says why (State, Reason); {exclude_fix(host)}",
            )
        )
    return findings


def job_tasks(env: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(this task, the step's tasks, the step) when trainfleet runs as a task of a step with
    several tasks; None in a batch script, salloc's shell, or a step of one task."""
    step, tasks = env.get("SLURM_STEP_ID"), env.get("SLURM_STEP_NUM_TASKS", "")
    if step is None or not tasks.isdigit() or int(tasks) < 2:
        return None
    task = env.get("SLURM_PROCID", "")
    return (int(task) if task.isdigit() else 0), int(tasks), step


def _job_wide(
    survey: Survey, finding: FindingId, severity: Severity, evidence: str, fix: str
) -> Finding:
    """One finding about the job itself, on every node of it."""
    return Finding(id=finding, severity=severity, nodes=tuple(_slurm_hosts(survey)),
                   evidence=[evidence], fix=fix)  # fmt: skip


def check_task_layout(survey: Survey) -> list[Finding]:
    found = job_tasks(survey.launch_env)
    if found is None:
        return []
    task, tasks, step = found
    job = survey.launch_env.get("SLURM_JOB_ID", "?")
    return [
        _job_wide(
            survey,
            FindingId.SLURM_TASK_LAYOUT,
            Severity.ERROR,
            f"this trainfleet is task {task} of the {tasks} of step {job}.{step}: each of them"
            f" starts the whole launch, {tasks} x the ranks on one master port",
            "run trainfleet once per job, in the batch script or salloc's shell, without srun:"
            " it starts one task per node itself",
        )
    ]


def check_export(survey: Survey) -> list[Finding]:
    value = survey.launch_env.get("SLURM_EXPORT_ENV")
    if not _slurm_hosts(survey) or value is None or value.split(",")[0] == "ALL":
        return []
    return [
        _job_wide(
            survey,
            FindingId.SLURM_EXPORT_NONE,
            Severity.WARNING,
            f"SLURM_EXPORT_ENV={value}: srun lines of this job start without its environment"
            " (PATH, the venv, HF_*)",
            "trainfleet's own steps ask for --export=ALL; before other srun lines of the script,"
            " `export SLURM_EXPORT_ENV=ALL`",
        )
    ]


def check_gpus(survey: Survey) -> list[Finding]:
    """The job's GPUs on a node (its slots, from SLURM_GPUS_ON_NODE...) against the GPUs the
    node's probe, a step of the job, sees."""
    findings = []
    for node in survey.cluster.nodes:
        facts = survey.facts.get(node.host)
        if node.slurm is None or facts is None or facts.gpus is None:
            continue
        seen, given = len(facts.gpus.devices), node.slots
        if not seen or seen == given:
            continue  # no GPU at all is a CPU node; nvidia-smi's own failure is reported apart
        fewer = seen < given
        findings.append(
            Finding(
                id=FindingId.SLURM_GPUS_DIFFER,
                severity=Severity.ERROR if fewer else Severity.WARNING,
                nodes=(node.host,),
                evidence=[
                    f"the job has {given} GPU slot(s) on {node.host} (SLURM_GPUS_ON_NODE, "
                    f"--gpus-per-node) and a step there sees {seen} GPU(s)"
                ],
                fix=(
                    f"ask for --gpus-per-node={seen}, or {exclude_fix(node.host)}"
                    if fewer
                    else f"{node.host} does not confine jobs to their GPUs (ConstrainDevices="
                    "yes in cgroup.conf): another job's GPUs are visible there; tell its admins"
                ),
            )
        )
    return findings
