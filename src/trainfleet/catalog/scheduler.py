"""Catalog entries: Slurm, inside a job (`salloc`, `sbatch`; docs/slurm.md)."""

from __future__ import annotations

from trainfleet.catalog.ids import Area, Entry, FindingId, Sandbox

_SLURM = Area.SLURM
_TESTS = ("test_slurm_sandbox.py",)

ENTRIES: dict[FindingId, Entry] = {
    FindingId.SLURM_NODE_UNREACHABLE: Entry(
        area=_SLURM,
        title="a node of the job does not run its step",
        seen="`srun` waits, then `Node failure on NODE` or `Unable to create step`; the "
        "ranks there never join",
        detect="each node is probed as a step of the job (`srun --overlap --nodelist=NODE`); "
        "a step that fails or does not start within the probe's bound",
        fix="`scontrol show node NODE` says why (State, Reason); resubmit without it: "
        "`sbatch --exclude=NODE` (`--sbatch-arg=--exclude=NODE`)",
        sandbox=Sandbox(setup="the node's slurmd stopped (SIGSTOP)", tests=_TESTS),
    ),
    FindingId.SLURM_TASK_LAYOUT: Entry(
        area=_SLURM,
        title="trainfleet runs as several tasks of one step",
        seen="`srun trainfleet launch` (or `srun torchrun`) with several tasks per node: each "
        "task starts the whole job, N x N ranks, `address already in use` on the master port",
        detect="SLURM_STEP_ID and SLURM_STEP_NUM_TASKS > 1 in trainfleet's own environment",
        fix="run trainfleet once per job, in the batch script or salloc's shell without srun: "
        "it starts one task per node itself",
        sandbox=Sandbox(setup="`srun --ntasks-per-node=2 trainfleet doctor`", tests=_TESTS),
    ),
    FindingId.SLURM_EXPORT_NONE: Entry(
        area=_SLURM,
        title="the job's steps do not inherit its environment",
        seen="`sbatch --export=NONE` or SLURM_EXPORT_ENV=NONE: srun lines start without PATH, "
        "the venv or HF_* variables; `command not found`, the wrong python",
        detect="SLURM_EXPORT_ENV in trainfleet's environment, not starting with ALL",
        fix="trainfleet's own steps ask for --export=ALL; for other srun lines of the script, "
        "`export SLURM_EXPORT_ENV=ALL` before them",
        sandbox=Sandbox(setup="SLURM_EXPORT_ENV=NONE", tests=_TESTS),
    ),
    FindingId.SLURM_GPUS_DIFFER: Entry(
        area=_SLURM,
        title="a node shows another number of GPUs than the job was given",
        seen="`invalid device ordinal`, ranks that share a GPU, or GPUs of another job in use",
        detect="SLURM_GPUS_ON_NODE (or --gpus-per-node) against the GPUs each node's probe "
        "sees, inside the job",
        fix="fewer: resubmit without the node (`--exclude=NODE`) or with --gpus-per-node it "
        "has; more: the node does not confine jobs to their GPUs (ConstrainDevices=yes in "
        "cgroup.conf), tell its admins",
    ),
}
