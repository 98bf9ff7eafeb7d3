"""The `slurm` backend: inside a Slurm allocation (`salloc`, an `sbatch` script), torchrun on
every node of the job, each node's bootstrap started as a step of the job (`srun --overlap`,
one task on that node, the job's CPUs there) instead of over ssh, which Slurm clusters block.

    >>> BACKEND.name, BACKEND.lookup_rounds
    ('slurm', 2)

The plan, the environment, the lifeline and the stack dumps are the ssh backend's: the
transport under them is the node's (`remote/argv.py`'s `node_argv` gives `srun` for a node of
the allocation), so nothing above it knows which it is. From a login node (no allocation),
`--backend slurm` submits the same command as a batch job instead (`launch/sbatch.py`).
"""

from __future__ import annotations

from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import LaunchBackend
from trainfleet.launch.backends.ssh import LaunchPlan, SshBackend


class SlurmBackend(SshBackend):
    name = "slurm"
    summary = (
        "torchrun on every node of the Slurm job, each started as a step of it (srun); from a"
        " login node, the command is submitted with sbatch and followed here"
    )

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        """The ssh backend's, once every node is known to be the job's: the first thing a
        launch asks of its backend, so that nothing is probed or planned otherwise."""
        outside = [node.host for node in cluster.nodes if node.slurm is None]
        if outside:
            raise TrainfleetError(
                f"--backend slurm starts ranks as steps of a Slurm job, and {outside[0]} is not"
                f" a node of one ({cluster.source})",
                "run inside an allocation (salloc, sbatch) without --hostfile/--hosts/-c, or"
                " from a login node with --nodes N to submit one",
            )
        return super().preflight(cluster, read_only=read_only)


BACKEND: LaunchBackend[LaunchPlan] = SlurmBackend()
