"""DeepSpeed's runner inside a Slurm job, on the sandbox's real Slurm. A file of its own: the
runner's cleanup of a failed job ends every DeepSpeed launcher on this machine, so its tests
share a worker with the other files that run it (tests/cluster_schedule.py), and the rest of
the Slurm tests do not have to."""

from __future__ import annotations

import slurm_jobs
from slurm_jobs import queue_once_completed, salloc_launch

pytestmark = slurm_jobs.PYTESTMARK


def test_where_ssh_gets_through_deepspeed_s_runner_runs_and_says_what_its_ranks_miss(
    make_sandbox, tmp_path
):
    """Where ssh to the job's nodes gets through (pam_slurm_adopt lets it in), DeepSpeed's
    runner works as on an ssh fleet, and trainfleet says what its ranks miss there."""
    box = make_sandbox(nodes=2, slurm=True)
    code, out = salloc_launch(box, tmp_path, "--backend", "deepspeed", "--ssh-config",
                              str(box.ssh_config))  # fmt: skip
    assert code == 0, out
    for rank, host in ((0, "gpu-node-1"), (1, "gpu-node-2")):
        # Started over ssh, not as a step: no SLURM_JOB_ID in the rank's environment.
        assert f"[{host}:{rank}] rank {rank} of 2 on {host} sum 2 job None" in out, out
    assert "DeepSpeed's runner starts the ranks over ssh (pdsh), not as steps of the job" in out
    assert queue_once_completed(box) == ""
