"""What every backend plans a launch from: the user's options (`LaunchOptions`), the few facts
the preflight gives about each node (`LaunchFacts`), and the master port both decide.

    >>> LaunchOptions(command=("train.py", "--lr", "1e-4")).backend
    'ssh'
    >>> choose_master_port(29500, (29500, 29501))[0]
    29502

Pure, like the plans that read it; which backend runs the launch is `options.backend`, a name
in `launch.backends`' registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainfleet.cluster import check_host

if TYPE_CHECKING:
    from trainfleet.cluster import Cluster

DEFAULT_BACKEND = "ssh"
"""The backend a launch uses unless told (`--backend`)."""
PORT_RANGE = (29500, 29600)
"""Where a free master port is looked for when the requested one is taken."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchOptions:
    command: tuple[str, ...]
    """The script and its arguments, or ("-m", module, *args)."""
    backend: str = DEFAULT_BACKEND
    """A name in `launch.backends.BACKENDS`."""
    master_port: int | None = None
    """None: the cluster's (29500 unless cluster.yaml says otherwise)."""
    master_addr: str | None = None
    """The rendezvous address every rank connects to (DeepSpeed's --master_addr); None: the
    master's address as the launch node resolves it."""

    def __post_init__(self) -> None:
        if self.master_addr is not None:
            check_host(self.master_addr, "--master_addr", None)

    local_rank_arg: str = "auto"
    """Pass `--local_rank=N` to the script: auto (when its source defines it), always, never."""
    no_python: bool = False
    """Run command[0] as an executable even when it is Python (torchrun's --no-python)."""
    run_id: str = "run"
    join_timeout: float = 60.0
    grace: float = 5.0
    """Seconds between SIGTERM and SIGKILL when a node's ranks are stopped."""
    hang_timeout: float | None = None
    """Seconds without any rank advancing a step (heartbeats) before the run is HUNG; None:
    no hang watchdog (a script that sends no heartbeats is never judged)."""
    startup_timeout: float | None = 1800.0
    """Seconds without startup progress (a new phase, or a phase's progress growing, in the
    beats before the first step: loading, tokenizing) before the run is HUNG in its startup;
    None: not judged. The hang timeout starts at the first step; once every rank has beaten its
    last step (the final save, an export), this bound applies again."""
    preempt_signal: str | None = None
    """USR1 under `--requeue` in a Slurm job: set on every rank as TRAINFLEET_PREEMPT_SIGNAL,
    the signal it gets before the job's time limit (launch/sbatch.py)."""
    restart: int = 0
    """How many times this run has been restarted (`--max-restarts`): TRAINFLEET_RESTART on
    every rank, so that a script knows to resume."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchFacts:
    """What the plan needs to know about one node: the few values `launch.launch_facts` takes
    from the preflight doctor's report (its `NodeFacts`, doctor/facts/, are the whole sheet)."""

    interface: str | None = None
    gpus: int = 0
    listening: tuple[int, ...] = ()
    python_version: tuple[int, int] | None = None
    """(major, minor) of the node's python, where its probe said."""
    silent_resolver: bool = False
    """The node's resolver did not answer the reverse lookups c10d makes there (doctor's
    `hostname-unresolvable` warning with its seconds): RES_OPTIONS shortens each wait."""


def choose_master_port(requested: int, listening: tuple[int, ...]) -> tuple[int, str | None]:
    """`requested` if nothing listens on it on the master, else the first free port above it.

    >>> choose_master_port(29500, (29500, 29501))[0], choose_master_port(29500, ())
    (29502, (29500, None))
    """
    if requested not in listening:
        return requested, None
    for port in range(max(requested + 1, PORT_RANGE[0]), PORT_RANGE[1]):
        if port not in listening:
            return port, (
                f"master port {requested} is taken on the master (see `trainfleet doctor`): "
                f"using {port}"
            )
    return requested, f"master port {requested} is taken and no free port found: kept it"


def master_port(
    cluster: Cluster, facts: Mapping[str, LaunchFacts], options: LaunchOptions
) -> tuple[int, list[str]]:
    """The port to use on the master (requested, or the first free one) and what to say."""
    listening = facts.get(cluster.master, LaunchFacts()).listening
    port, note = choose_master_port(options.master_port or cluster.master_port, listening)
    return port, [note] if note else []
