"""The node side of a launch (stdlib only, Python 3.8 syntax): starts the node's command and
guarantees that nothing of it outlives the launch.

The launcher ships it as every node program is shipped (`trainfleet.node.line`) and calls
main(job). After the program's line, stdin is the lifeline: when it closes (the launcher
stopped the job, died, or its ssh connection dropped), or on SIGTERM/SIGHUP, every process of
the job on this node gets SIGTERM, then SIGKILL after a grace period. The launcher
also sends an empty line every few seconds: when none has come for `lifeline` seconds, the
connection is lost without having closed (a link down, the launch machine gone: TCP notices
nothing for hours), and the job is stopped the same way, so that no rank of it keeps holding
the node's GPUs and ports.

"Every process of the job": the command runs in its own session, and this process is made a
child subreaper (prctl), so that workers which leave their parent's session (torchrun starts
each rank in a new session) or lose their parent are still its descendants. They are found by
pid from /proc, never by name.

A line `signal USR1` (or USR2) on the lifeline passes that signal on to the command's children:
under torchrun, its ranks, and not the agent, which would die of it. That is how a signal Slurm
sends trainfleet before a job's time limit (`--requeue`) reaches the ranks on every node.

The job is a BootstrapJob. It has no answer: the command's output streams through, with the
marks the launcher reads while it runs (`@@trainfleet:RUN_ID:pid:N` here, the shim's), and its
exit code is the node's.

Inside a Slurm allocation one step of the job runs the bootstrap on every node at once
(`step`): srun gives every task the same stdin, so each task reads every node's job and runs
the one of its task number, on the node it was planned for.
"""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, TypedDict

PR_SET_CHILD_SUBREAPER = 36


class BootstrapJob(TypedDict):
    run_id: str
    cwd: Optional[str]
    """None: the login directory."""
    env: Dict[str, str]
    """Set over the login environment."""
    argv: List[str]
    """The token {SHIM} is replaced by the path of the rank shim written here."""
    shim: str
    """The shim's source (`trainfleet.node.shim`)."""
    grace: float
    """Seconds between SIGTERM and SIGKILL."""
    lifeline: float
    """Seconds without a line from the launcher before the job stops (0: no limit)."""


def become_subreaper():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, the session kill still reaches them


def child_table() -> Dict[int, List[int]]:
    """Parent pid -> its children's pids, from /proc."""
    table: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        table.setdefault(ppid, []).append(int(entry))
    return table


def descendants(root: int) -> List[int]:
    """Pids below `root`."""
    table = child_table()
    found, todo = [], [root]
    while todo:
        for child in table.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


FORWARDED = {"USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2}
"""The signals a `signal NAME` line may pass on."""


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(child_pid: int, status: Dict[str, Optional[int]]) -> None:
    """Collect exited descendants; record the command's own exit status."""
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == child_pid:
            if os.WIFSIGNALED(raw):
                status["rc"] = -os.WTERMSIG(raw)
            else:
                status["rc"] = os.WEXITSTATUS(raw)


def stop_everything(child_pid: int, status: Dict[str, Optional[int]], grace: float) -> None:
    """SIGTERM to every descendant (and the command's session), SIGKILL what is left after
    `grace` seconds; returns when none is left."""
    me = os.getpid()
    try:
        os.killpg(child_pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while descendants(me) and time.monotonic() < deadline:
        reap(child_pid, status)
        time.sleep(0.05)
    while True:
        reap(child_pid, status)
        left = descendants(me)
        if not left:
            return
        signal_all(left, signal.SIGKILL)
        time.sleep(0.05)


def step(hosts: List[str], shim: str, jobs: List[BootstrapJob]) -> int:
    """One task of a Slurm step that starts every node's job at once: task N (SLURM_PROCID)
    runs jobs[N], planned for hosts[N]. Slurm numbers a step's tasks in its nodes' order,
    which is the job's (`SLURM_JOB_NODELIST`); a task on another node than planned refuses to
    start, since the launcher would put its output under the wrong node. The shim's source
    travels once for all."""
    task = int(os.environ.get("SLURM_PROCID", "-1"))
    here = os.environ.get("SLURMD_NODENAME", "")
    planned = hosts[task] if 0 <= task < len(hosts) else None
    if planned is None or planned != here:
        sys.stderr.write(
            "trainfleet: Slurm started task %d of this launch's step on %s, planned for %s"
            " (the nodes %s, in SLURM_JOB_NODELIST's order): a trainfleet bug, please report"
            " it\n" % (task, here or "a node it did not name", planned, ",".join(hosts))
        )
        return 1
    job = jobs[task]
    job["shim"] = shim
    return main(job)


def main(job: BootstrapJob) -> int:
    stop = threading.Event()
    heard = [time.monotonic()]  # when the launcher last wrote

    command: List[int] = []  # its pid, once started

    def watch_stdin():
        try:
            for line in iter(sys.stdin.readline, ""):
                heard[0] = time.monotonic()
                word = line.split()
                if len(word) == 2 and word[0] == "signal" and word[1] in FORWARDED and command:
                    pids = child_table().get(command[0]) or command
                    signal_all(pids, FORWARDED[word[1]])
                    sys.stderr.write(
                        "trainfleet: SIG%s passed on to pid(s) %s\n"
                        % (word[1], " ".join(map(str, pids)))
                    )
                    sys.stderr.flush()
        except (OSError, ValueError):
            pass
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    become_subreaper()
    workdir = tempfile.mkdtemp(prefix="trainfleet-%s-" % job["run_id"])  # mode 0700
    status: Dict[str, Optional[int]] = {"rc": None}
    try:
        shim = os.path.join(workdir, "shim.py")
        with open(shim, "w") as f:
            f.write(job["shim"])
        argv = [shim if word == "{SHIM}" else word for word in job["argv"]]
        env = dict(os.environ)
        env.update(job["env"])
        try:
            proc = subprocess.Popen(
                argv,
                cwd=job["cwd"] or None,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            sys.stderr.write("trainfleet: cannot start %s: %s\n" % (argv[0], exc))
            return 127
        command.append(proc.pid)
        sys.stderr.write("@@trainfleet:%s:pid:%d\n" % (job["run_id"], os.getpid()))
        sys.stderr.flush()
        threading.Thread(target=watch_stdin, daemon=True).start()
        lifeline = job["lifeline"]
        while status["rc"] is None and not stop.is_set():
            reap(proc.pid, status)
            if lifeline and time.monotonic() - heard[0] > lifeline:
                sys.stderr.write(
                    "trainfleet: nothing from the launcher for %d s (its connection is lost):"
                    " stopping this node's job\n" % lifeline
                )
                sys.stderr.flush()
                stop.set()
            stop.wait(0.1)
        stopped = status["rc"] is None  # the loop ended on a stop, not on the command's exit
        stop_everything(proc.pid, status, job["grace"])
        rc = status["rc"]
        if stopped or rc is None:
            return 143  # stopped by the launcher (128 + SIGTERM)
        return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
