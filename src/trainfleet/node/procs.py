"""A run's processes on a node: ending all of them by the run's id, and what each rank is
doing (its kernel state and a py-spy stack dump) when the hang watchdog fires.

    >>> tagged("r-1", b"PATH=/bin\\0TRAINFLEET_RUN_ID=r-1\\0")
    True
    >>> tagged("r-1", b"X=TRAINFLEET_RUN_ID=r-1\\0"), tagged("r-1", b"TRAINFLEET_RUN_ID=r-12\\0")
    (False, False)
"""

import os
import shutil
import signal
import subprocess
import sys
import time

DUMP_TIMEOUT_S = 10


def tagged(run_id, environ):
    """Whether a process environment (/proc/PID/environ's bytes) is this run's."""
    tag = ("TRAINFLEET_RUN_ID=" + run_id).encode()
    return tag in environ.split(b"\0")


def run_pids(run_id):
    """Pids of this user's processes whose environment carries the run's id (not this one)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if tagged(run_id, f.read()) and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def kill_run(run_id):
    """Ends every process of the run on this node: SIGTERM, 3 s, then SIGKILL, 1 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        for pid in run_pids(run_id):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + wait
        while run_pids(run_id) and time.time() < deadline:
            time.sleep(0.1)


def dump_stacks(ranks):
    """For each "RANK=PID": a `@@rank RANK pid PID` line, the process's `State:` line from
    /proc/PID/status (`T (stopped)` is a SIGSTOP), then `py-spy dump --nonblocking` (it reads
    the process's memory without pausing it, so a stopped or wedged rank can be read too).
    py-spy is looked up beside this python, then on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    spy = here if os.access(here, os.X_OK) else shutil.which("py-spy")
    for item in ranks:
        rank, pid = item.split("=")
        print("@@rank " + rank + " pid " + pid)
        try:
            with open("/proc/%s/status" % pid) as f:
                print([line for line in f.read().splitlines() if line.startswith("State:")][0])
        except (OSError, IndexError):
            print("State:\tgone (the process has exited)")
            continue
        if not spy:
            print("py-spy is not installed on this node: `pip install py-spy` into its python")
            continue
        try:
            done = subprocess.run(
                [spy, "dump", "--nonblocking", "--pid", pid],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=DUMP_TIMEOUT_S,
            )
            print(done.stdout)
        except subprocess.TimeoutExpired:
            print("py-spy dump did not answer within %d s" % DUMP_TIMEOUT_S)
        sys.stdout.flush()
