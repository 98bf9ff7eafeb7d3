"""A run's processes on a node: ending all of them by the run's id, and what each rank is
doing (its kernel state, its Flight Recorder summary and a py-spy stack dump) when the hang
watchdog fires.

    >>> tagged("r-1", b"PATH=/bin\\0TRAINFLEET_RUN_ID=r-1\\0")
    True
    >>> tagged("r-1", b"X=TRAINFLEET_RUN_ID=r-1\\0"), tagged("r-1", b"TRAINFLEET_RUN_ID=r-12\\0")
    (False, False)
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

from trainfleet.node import shim

DUMP_TIMEOUT_S = 10
FLIGHT_RECORD_WAIT_S = 2.0
"""How long the ranks of a node get to write their Flight Recorder summaries (the shim's
thread looks for a request every 0.5 s)."""


def tagged(run_id, environ):
    """Whether a process environment (/proc/PID/environ's bytes) is this run's."""
    tag = ("%s=%s" % (shim.RUN_ID_ENV, run_id)).encode()
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


def shim_dir(pid):
    """The directory of the rank shim that process PID runs (`python -u DIR/shim.py ...`),
    when it is a private directory of this user's (as the launch made it), else None: a pid
    comes from a rank's heartbeat, and nothing is written where its command line points
    unless the launch could have made that directory."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return None
    for word in words[1:4]:
        if os.path.basename(word) == b"shim.py" and os.path.isabs(word):
            directory = os.path.dirname(word).decode(errors="replace")
            try:
                st = os.lstat(directory)
            except OSError:
                return None
            private = stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077
            return directory if private and st.st_uid == os.getuid() else None
    return None


def flight_records(pids):
    """{rank: pid} -> {rank: the JSON text of its Flight Recorder summary}, for the ranks that
    wrote one within FLIGHT_RECORD_WAIT_S of the request (a stopped rank cannot)."""
    token = "%d-%d" % (os.getpid(), time.time_ns())
    where = {}
    for rank, pid in pids.items():
        directory = shim_dir(pid)
        if directory is None:
            continue
        flight = os.path.join(directory, "flight")
        where[rank] = os.path.join(flight, "rank%s.json" % rank)
        try:
            os.makedirs(flight, mode=0o700, exist_ok=True)
            with open(os.path.join(flight, "rank%s.request" % rank), "w") as f:
                f.write(token)
        except OSError:
            del where[rank]
    found = {}
    deadline = time.time() + FLIGHT_RECORD_WAIT_S
    while where and time.time() < deadline:
        time.sleep(0.1)
        for rank, path in list(where.items()):
            try:
                with open(path) as f:
                    text = f.read()
                answer = json.loads(text)
            except (OSError, ValueError):
                continue
            if isinstance(answer, dict) and answer.get("request") == token:
                found[rank] = json.dumps(answer)  # one line
                del where[rank]
    return found


def dump_stacks(ranks):
    """For each "RANK=PID": a `@@rank RANK pid PID` line, its Flight Recorder summary as one
    `@@flight JSON` line when the rank wrote one (flight_records), the process's `State:` line from
    /proc/PID/status (`T (stopped)` is a SIGSTOP), then `py-spy dump --nonblocking` (it reads
    the process's memory without pausing it, so a stopped or wedged rank can be read too).
    py-spy is looked up beside this python, then on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    spy = here if os.access(here, os.X_OK) else shutil.which("py-spy")
    pids = dict(item.split("=") for item in ranks)
    records = flight_records(pids)
    for rank, pid in pids.items():
        print("@@rank " + rank + " pid " + pid)
        if rank in records:
            print("@@flight " + records[rank])
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
