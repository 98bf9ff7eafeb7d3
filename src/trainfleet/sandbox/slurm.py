"""A real Slurm in the sandbox (`sandbox up --slurm`): munge, slurmctld on node 1, a slurmd on
every node, each daemon in its node's network and UTS namespaces.

    >>> from trainfleet.sandbox import up
    >>> sandbox = up(nodes=2, slurm=True)  # doctest: +SKIP
    >>> slurm_env(sandbox)["SLURM_CONF"]  # doctest: +SKIP
    '/run/trainfleet/sandbox/tf/slurm/slurm.conf'

Debian 12's own packages (slurm 22.05, munge 0.5.15: `make test` installs them as it installs
sshd). Everything lives in the state dir's slurm/: the munge key and socket, slurm.conf, the
controller's state, each node's spool, pid and log (`%n` in their paths: one slurmd per node on
one machine). Stock Debian slurmd is not built for several slurmd per host (`-N` needs
--enable-multiple-slurmd), so each node's slurmd runs in a UTS namespace whose hostname is its
NodeName. munged is one daemon on this machine whose socket every node's daemons share (the
nodes share this machine's file system); slurmctld and slurmd run in the node's network
namespace with its /etc/hosts (`_in_node`). proctrack/linuxproc and task/none: nothing of
Slurm's depends on systemd or cgroup delegation. `down` ends the node daemons with the node's
namespace and munged by its pid file (`stop`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trainfleet.errors import SandboxError
from trainfleet.localprocs import pid_alive
from trainfleet.sandbox import netns
from trainfleet.sandbox.state import Sandbox

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
"""What `apt-get install` gives for `--slurm` (Debian 12: slurm 22.05.8, munge 0.5.15)."""
MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
IDLE_TIMEOUT_S = 60.0
PARTITION = "debug"


@dataclass(frozen=True, slots=True)
class SlurmFiles:
    """Where a sandbox's Slurm keeps its files: all under STATE/slurm."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge" / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge-run" / "munge.socket"

    @property
    def munged_pid(self) -> Path:
        return self.root / "munge" / "munged.pid"

    def log(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"


def files_of(state_dir: Path) -> SlurmFiles:
    return SlurmFiles(state_dir / "slurm")


def slurm_env(sandbox: Sandbox) -> dict[str, str]:
    """What a Slurm client (`srun`, `sbatch`, `sinfo`) needs to reach this sandbox's Slurm."""
    return {"SLURM_CONF": str(files_of(sandbox.state_dir).conf)}


def require_slurm() -> None:
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    missing += [tool for tool in ("srun", "sbatch", "salloc", "sinfo") if not shutil.which(tool)]
    if missing:
        raise SandboxError(
            f"--slurm needs Slurm and munge, and {', '.join(missing)} is missing",
            f"apt-get install {' '.join(PACKAGES)} (as root; `make test` does)",
        )


def config_text(sandbox: Sandbox, paths: SlurmFiles, *, cpus: int) -> str:
    """slurm.conf: node 1 the controller, every node a NodeName at its sandbox address."""
    root = paths.root
    master = sandbox.nodes[0]
    lines = [
        f"ClusterName=tf{sandbox.name}",
        f"SlurmctldHost={master.hostname}({master.address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        "CredType=cred/munge",
        f"StateSaveLocation={root / 'ctld'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd.%n.pid'}",
        f"SlurmctldLogFile={paths.log('slurmctld')}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "KillWait=5",
        # Sandbox nodes share this machine's cores: each says it has them all.
        *(
            f"NodeName={node.hostname} NodeAddr={node.address} CPUs={cpus} State=UNKNOWN"
            for node in sandbox.nodes
        ),
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def start(sandbox: Sandbox) -> None:
    """Write the files, start munged, slurmctld and every slurmd; return once every node is
    idle (or raise naming the log to read)."""
    require_slurm()
    paths = files_of(sandbox.state_dir)
    for sub in ("munge", "munge-run", "ctld", "spool", "run", "log"):
        (paths.root / sub).mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o755)
    (paths.root / "munge").chmod(0o700)
    (paths.root / "munge-run").chmod(0o755)  # munged: "execute permissions for all required"
    paths.munge_key.write_bytes(os.urandom(1024))
    paths.munge_key.chmod(0o400)
    paths.conf.write_text(config_text(sandbox, paths, cpus=os.cpu_count() or 1))
    netns.run(
        [MUNGED, f"--key-file={paths.munge_key}", f"--socket={paths.munge_socket}",
         f"--pid-file={paths.munged_pid}", f"--log-file={paths.log('munged')}",
         f"--seed-file={paths.root / 'munge' / 'munged.seed'}", "--force"],
    )  # fmt: skip
    _in_node(sandbox, 1, SLURMCTLD, paths)
    for node in sandbox.nodes:
        _in_node(sandbox, node.index, SLURMD, paths)
    _wait_idle(sandbox, paths)


def _in_node(sandbox: Sandbox, index: int, daemon: str, paths: SlurmFiles) -> None:
    """`daemon -f CONF` (it forks into the background) in node `index`'s network namespace and
    a UTS namespace of its own, the node's /etc/netns files bound over /etc as `ip netns exec`
    does. Not `ip netns exec` itself: it mounts a /sys without the cgroup tree, and slurmd
    refuses to start without one ("No filesystem mounted on /sys/fs/cgroup")."""
    node = sandbox.node(index)
    script = (
        'for f in "$4"/*; do [ -e "$f" ] && mount --bind "$f" "/etc/${f##*/}"; done; '
        'hostname "$1" && exec "$2" -f "$3"'
    )
    argv = ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "--mount",
            "sh", "-c", script, "sh", node.hostname, daemon, str(paths.conf),
            f"/etc/netns/{node.netns}"]  # fmt: skip
    netns.run(argv, timeout=30)


def _wait_idle(sandbox: Sandbox, paths: SlurmFiles) -> None:
    want = {node.hostname for node in sandbox.nodes}
    env = {**os.environ, "SLURM_CONF": str(paths.conf)}
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env
        )
        states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        if want <= states.keys() and all(states[n] == "idle" for n in want):
            return
        time.sleep(0.5)
    raise SandboxError(
        f"Slurm's nodes are not idle after {IDLE_TIMEOUT_S:.0f} s: {states or 'no answer'}",
        f"read {paths.log('slurmctld')} and {paths.root / 'log'}/slurmd.NODE.log",
    )


def stop(state_dir: Path) -> list[str]:
    """End this sandbox's munged (the node daemons end with their namespaces); what it did."""
    pid_file = files_of(state_dir).munged_pid
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    if b"munged" not in cmdline or str(state_dir).encode() not in cmdline:
        return []  # the pid was reused: not ours
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"munged {pid}"]
