"""The node side of a launch, run here for real: the bootstrap (exit codes; nothing of the job
outlives a closed stdin, not even a process in its own session) and the rank shim (join marks,
--local_rank)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainfleet import node
from trainfleet.localprocs import cmdlines
from trainfleet.node import bootstrap, files, shim

pytestmark = pytest.mark.unit

SHIM = Path(shim.__file__)


def _start(argv, run_id="t1", **job_fields) -> subprocess.Popen:
    proc = subprocess.Popen(
        node.argv(sys.executable, bootstrap),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    job = bootstrap.BootstrapJob(run_id=run_id, cwd=None, env={}, argv=argv, shim="", grace=2,
                                 lifeline=0)  # fmt: skip
    job.update(job_fields)
    proc.stdin.write(node.line(bootstrap.main, job))
    proc.stdin.flush()
    return proc


def _pids_with(word: str) -> list[int]:
    return [pid for pid, words in cmdlines().items() if word in words]


def test_a_running_bootstrap_is_named_in_its_command_line():
    """`ps` shows `trainfleet-bootstrap`: what the sandbox tests' leftover checks look for."""
    proc = _start(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not _pids_with("sleep 30") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in _pids_with("trainfleet-bootstrap")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_the_exit_code_of_the_command_is_the_bootstraps():
    proc = _start(["sh", "-c", "echo out; echo err >&2; exit 7"])
    out, err = proc.stdout.read(), proc.stderr.read()  # stdin stays open: the job is not stopped
    assert proc.wait(timeout=30) == 7
    proc.stdin.close()
    assert out.decode() == "out\n" and "err\n" in err.decode()


def test_closing_stdin_kills_every_process_of_the_job_even_in_another_session():
    # A child that starts a grandchild in a session of its own (as torchrun does for ranks).
    marker = f"{time.time_ns() % 10**6}.123"
    child = (
        f"import subprocess, time; subprocess.Popen(['setsid', 'sleep', '{marker}']); "
        "time.sleep(300)"
    )
    proc = _start([sys.executable, "-c", child])
    deadline = time.monotonic() + 20
    while not _pids_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pids_with(f"sleep {marker}"), "the grandchild never started"
    started = time.monotonic()
    proc.stdin.close()
    proc.wait(timeout=15)
    assert time.monotonic() - started < 5
    assert proc.returncode == 143
    assert _pids_with(f"sleep {marker}") == []


def test_a_signal_line_reaches_the_commands_children_and_not_the_command(tmp_path):
    """`signal USR1` on the lifeline: under torchrun the command is the agent, which SIGUSR1
    would kill, and its children are the ranks, whose handler saves a checkpoint."""
    rank = tmp_path / "rank.py"
    rank.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: (print('rank got USR1', flush=True),"
        " sys.exit(0)))\n"
        "print('rank ready', flush=True)\n"
        "time.sleep(60)\n"
        "sys.exit(3)\n"
    )
    agent = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '{rank}']))"
    proc = _start([sys.executable, "-c", agent])
    assert proc.stdout.readline() == b"rank ready\n"
    proc.stdin.write(b"signal USR1\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"rank got USR1\n"
    assert proc.wait(timeout=20) == 0  # the agent lived on and ended with its rank's code
    assert b"trainfleet: SIGUSR1 passed on to pid(s) " in proc.stderr.read()
    proc.stdin.close()


def test_a_silent_launcher_stops_the_job_after_the_lifeline():
    """Keepalive lines keep the job running; once they stop coming (a link down: stdin stays
    open, nothing arrives) the job is stopped after `lifeline` seconds."""
    marker = f"{time.time_ns() % 10**6}.456"
    proc = _start(["sleep", marker], lifeline=1.5)
    for _ in range(10):  # 3 s of keepalives, twice the lifeline
        time.sleep(0.3)
        proc.stdin.write(b"\n")
        proc.stdin.flush()
    assert proc.poll() is None and _pids_with(f"sleep {marker}")
    silent = time.monotonic()
    assert proc.wait(timeout=15) == 143
    assert 1.5 <= time.monotonic() - silent < 4
    assert b"nothing from the launcher for 1 s" in proc.stderr.read()
    assert _pids_with(f"sleep {marker}") == []
    proc.stdin.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_shim(tmp_path, script_text, *args, mode="auto"):
    script = tmp_path / "script.py"
    script.write_text(script_text)
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "TRAINFLEET_RUN_ID": "r9",
        "TRAINFLEET_LOCAL_RANK_ARG": mode,
    }
    return subprocess.run(
        [sys.executable, str(SHIM), str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


PRINT_ARGS = "import sys, json\nprint(json.dumps(sys.argv[1:]))\n"
LOCAL_RANK_SCRIPT = (
    "import argparse, json\n"
    "p = argparse.ArgumentParser()\n"
    "p.add_argument('--local_rank', type=int, default=-1)\n"
    "p.add_argument('--lr')\n"
    "print(json.dumps(vars(p.parse_args())))\n"
)


def test_local_rank_is_passed_only_to_scripts_that_define_it(tmp_path):
    plain = _run_shim(tmp_path, PRINT_ARGS, "--lr", "1")
    assert json.loads(plain.stdout) == ["--lr", "1"]
    wants = _run_shim(tmp_path, LOCAL_RANK_SCRIPT, "--lr", "1")
    assert json.loads(wants.stdout) == {"local_rank": 0, "lr": "1"}
    never = _run_shim(tmp_path, LOCAL_RANK_SCRIPT, "--lr", "1", mode="never")
    assert json.loads(never.stdout)["local_rank"] == -1
    always = _run_shim(tmp_path, PRINT_ARGS, mode="always")
    assert json.loads(always.stdout) == ["--local_rank=0"]


def test_the_shim_marks_start_and_the_real_gloo_init_and_keeps_the_scripts_exit_code(tmp_path):
    script = (
        "import sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('world', dist.get_world_size())\n"
        "dist.destroy_process_group()\n"
        "sys.exit(5)\n"
    )
    done = _run_shim(tmp_path, script)
    assert done.returncode == 5, done.stderr
    assert done.stdout == "world 1\n"
    marks = [line for line in done.stderr.splitlines() if line.startswith("@@trainfleet")]
    assert marks == [
        "@@trainfleet:r9:started:0",
        "@@trainfleet:r9:entered:0",
        "@@trainfleet:r9:joined:0",
        "@@trainfleet:r9:exit=5:0",
    ]


@pytest.mark.parametrize(
    ("ending", "code", "left_initialized"),
    [("", 0, "False"), ("sys.exit(0)\n", 0, "False"), ("sys.exit(3)\n", 3, "True")],
)
def test_a_process_group_a_successful_script_left_is_destroyed_before_teardown(
    tmp_path, ending, code, left_initialized
):
    # The CI run of 2026-11-24 lost an Accelerate job to gloo aborting one rank at exit
    # ("terminate called without an active exception") after every rank had printed its result.
    script = (
        "import atexit, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "atexit.register(lambda: print('initialized at exit', dist.is_initialized()))\n" + ending
    )
    done = _run_shim(tmp_path, script)
    assert done.returncode == code, done.stderr
    assert done.stdout == f"initialized at exit {left_initialized}\n"


@pytest.mark.parametrize("ending", ["", "sys.exit(0)\n"])
def test_what_holds_the_group_is_let_go_at_exit_while_the_interpreter_is_whole(tmp_path, ending):
    # A fresh-clone run of 2026-11-24 lost the Accelerate job again with the group destroyed:
    # torch's imports keep the script's namespace alive (dill, sys.modules["__mp_main__"]), so
    # a DDP model there took the group's gloo threads into the interpreter's teardown.
    script = (
        "import builtins, os, sys, weakref, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))\n"
        "model.loop = [model]\n"
        # The callback binds its names now: the namespace is cleared by the time it runs.
        "said = lambda _, os=os, sys=sys: os.write(\n"
        "    1, b'collected, finalizing: %d\\n' % sys.is_finalizing())\n"
        "builtins.WATCH = weakref.ref(model, said)\n" + ending
    )
    done = _run_shim(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "collected, finalizing: 0\n"


def test_prefixed_output_tags_every_line_of_the_rank_and_its_children(tmp_path):
    script = (
        "import subprocess, sys\n"
        "print('out line')\n"
        "print('err line', file=sys.stderr)\n"
        "subprocess.run(['echo', 'child line'])\n"
        "sys.stdout.write('no newline')\n"
        "raise SystemExit(4)\n"
    )
    (tmp_path / "s.py").write_text(script)
    env = {**os.environ, "TRAINFLEET_PREFIX_OUTPUT": "1", "LOCAL_RANK": "3", "RANK": "7"}
    done = subprocess.run(
        [sys.executable, "-u", str(SHIM), str(tmp_path / "s.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4
    assert done.stdout.splitlines() == [
        "[default3]:out line",
        "[default3]:child line",
        "[default3]:no newline",
    ]
    assert "[default3]:err line" in done.stderr.splitlines()
    assert all(line.startswith("[default3]:") for line in done.stderr.splitlines())


def _shim_command(tmp_path, *command, **env_vars):
    env = {
        **os.environ,
        "RANK": "2",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "TRAINFLEET_RUN_ID": "r9",
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        **env_vars,
    }
    return subprocess.run(
        [sys.executable, str(SHIM), *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def _marks(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("@@trainfleet")]


def test_a_shell_script_runs_as_an_executable_with_torchruns_environment(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(
        '#!/bin/sh\necho "rank $RANK/$WORLD_SIZE local $LOCAL_RANK args $*"\nexit 6\n'
    )
    script.chmod(0o755)
    done = _shim_command(tmp_path, "./run.sh", "--epochs", "1")
    assert done.returncode == 6, done.stderr
    assert done.stdout == "rank 2/4 local 1 args --epochs 1\n"
    assert _marks(done.stderr) == ["@@trainfleet:r9:started:2", "@@trainfleet:r9:exit=6:2"]
    # With DeepSpeed's launcher in front: its --local_rank goes only where asked for.
    done = _shim_command(tmp_path, "--local_rank=1", "./run.sh", "x")
    assert done.stdout.endswith("args x\n")
    done = _shim_command(
        tmp_path, "--local_rank=1", "./run.sh", "x", TRAINFLEET_LOCAL_RANK_ARG="always"
    )
    assert done.stdout.endswith("args --local_rank=1 x\n")


def test_a_console_script_of_this_python_runs_in_the_rank_and_its_joins_are_seen(tmp_path):
    """pip writes `#!/venv/bin/python` wrappers (llamafactory-cli, trl): run in-process, so the
    shim's init_process_group marks still come."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "my-trainer"
    tool.write_text(
        f"#!{sys.executable}\n"
        "import sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:"
        f"{_free_port()}')\n"
        "print('joined', sys.argv[1:])\n"
    )
    tool.chmod(0o755)
    done = _shim_command(tmp_path, "my-trainer", "train", "cfg.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "joined ['train', 'cfg.yaml']\n"
    assert _marks(done.stderr) == [
        "@@trainfleet:r9:started:2",
        "@@trainfleet:r9:entered:2",
        "@@trainfleet:r9:joined:2",
        "@@trainfleet:r9:exit=0:2",
    ]
    # --no-python: the same program as an executable (no join marks from outside Python).
    done = _shim_command(tmp_path, "my-trainer", "x", TRAINFLEET_NO_PYTHON="1")
    assert done.returncode == 0, done.stderr
    assert _marks(done.stderr) == ["@@trainfleet:r9:started:2", "@@trainfleet:r9:exit=0:2"]


def test_a_command_found_nowhere_ends_the_rank_with_127_naming_the_path(tmp_path):
    done = _shim_command(tmp_path, "llamafactory-cli", "train", "cfg.yaml")
    assert done.returncode == 127
    assert "llamafactory-cli: not found on this node" in done.stderr
    assert str(tmp_path / "bin") in done.stderr  # the PATH it looked in
    assert _marks(done.stderr)[-1] == "@@trainfleet:r9:exit=127:2"


WAIT_FOR_A_JIT_LOCK = """\
import os, sys, threading
import torch.distributed as dist
from torch.utils import cpp_extension  # what DeepSpeed's op builder imports
from torch.utils.file_baton import FileBaton
lock = sys.argv[1]
open(lock, "w").close()  # held by someone else, who lets go after 2.6 s
threading.Timer(2.6, os.remove, [lock]).start()
FileBaton(lock).wait()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
print("built")
"""


def test_a_rank_waiting_for_a_jit_build_lock_says_so_and_its_joins_are_still_seen(tmp_path):
    (tmp_path / "train.py").write_text(WAIT_FOR_A_JIT_LOCK)
    lock = tmp_path / "lock"
    done = _shim_command(
        tmp_path, "train.py", str(lock), str(_free_port()), TRAINFLEET_JIT_LOCK_REPORT_S="1"
    )
    assert done.returncode == 0, done.stderr
    waits = [line for line in done.stderr.splitlines() if "JIT build lock" in line]
    assert len(waits) >= 2, done.stderr  # one a second while it waits (2.6 s)
    said = re.compile(rf"trainfleet: rank 2 has waited \d+ s for torch's JIT build lock {lock}: ")
    assert all(said.match(line) for line in waits), waits
    assert "`trainfleet doctor` names a stale lock, `--fix` removes it" in waits[0]
    assert _marks(done.stderr)[-3:] == [
        "@@trainfleet:r9:entered:2",
        "@@trainfleet:r9:joined:2",
        "@@trainfleet:r9:exit=0:2",
    ]
    assert done.stdout.strip() == "built"


def _node_files(directory: Path) -> subprocess.CompletedProcess:
    job = files.PrivateJob(dir=str(directory), remove=False,
                           files={"shim.py": "print('ours')\n", "node_env.json": "[]"})  # fmt: skip
    return subprocess.run(
        node.argv(sys.executable, files),
        input=node.line(files.put_private, job).decode(),
        capture_output=True,
        text=True,
    )


def test_the_deepspeed_backends_node_directory_is_private_or_refused(tmp_path):
    """/tmp/trainfleet-RUN_ID has a predictable name: one another user made first (or made
    writable, or a link) would let them swap the shim that runs as the launching user (#17)."""
    fresh = tmp_path / "trainfleet-run1"
    assert _node_files(fresh).returncode == 0
    assert fresh.stat().st_mode & 0o777 == 0o700
    assert (fresh / "shim.py").stat().st_mode & 0o777 == 0o600
    assert _node_files(fresh).returncode == 0  # a restart of the same run
    open_to_all = tmp_path / "trainfleet-run2"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)
    link = tmp_path / "trainfleet-run3"
    link.symlink_to(fresh)
    for planted in (open_to_all, link):
        done = _node_files(planted)
        assert done.returncode == 3, done
        assert "is not this user's private directory" in done.stderr
        assert not (planted / "shim.py").exists() or planted == link
    assert (fresh / "shim.py").read_text() == "print('ours')\n"
    if os.getuid() == 0:  # another owner: only root can make one here
        theirs = tmp_path / "trainfleet-run4"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        assert _node_files(theirs).returncode == 3
        assert not (theirs / "shim.py").exists()


def test_the_hang_watchdogs_stack_dump_is_taken_by_the_shipped_program_on_each_node():
    """What `launch` hands the watchdog: the node program runs on every node of the run (here
    this machine, a one-node cluster run locally) and gives each rank's kernel state; py-spy's
    dump follows where it is installed. A rank already gone says so."""
    from trainfleet.cluster import load_cluster
    from trainfleet.launch.backends.over_ssh import dump_stacks

    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        cluster = load_cluster()
        host = cluster.nodes[0].host
        dumps = dump_stacks(cluster, {host: {0: stopped.pid, 1: gone.pid}})
        assert list(dumps) == [host]
        assert f"@@rank 0 pid {stopped.pid}\nState:\tT (stopped)" in dumps[host]
        assert f"@@rank 1 pid {gone.pid}\nState:\tgone (the process has exited)" in dumps[host]
    finally:
        stopped.kill()
        stopped.wait()


def test_a_ranks_flight_record_comes_back_with_its_stack_dump(tmp_path):
    """A one-rank gloo job run by the shim (from a private directory, as a launch writes it)
    does three all_reduces and waits in Python: the node's dump asks its shim thread for the
    Flight Recorder summary, which arrives as the rank's `@@flight` line with the three
    collectives done and none pending; the launcher's side reads it as data."""
    from trainfleet.cluster import load_cluster
    from trainfleet.launch import collectives, stacks
    from trainfleet.launch.backends.over_ssh import dump_stacks

    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    shim_copy = private / "shim.py"
    shim_copy.write_text(SHIM.read_text())
    script = tmp_path / "script.py"
    script.write_text(
        "import time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "import json, torch._C._distributed_c10d as c10d\n"
        "for _ in range(3):\n"
        "    dist.all_reduce(torch.ones(7))\n"
        # gloo marks a collective complete in the recorder from its own thread, a moment after
        # all_reduce returns (seen lagging by one under load): wait until it has.
        "deadline = time.time() + 20\n"
        "while time.time() < deadline and json.loads(c10d._dump_fr_trace_json())['pg_status']"
        "['0']['last_completed_collective'] != '3':\n"
        "    time.sleep(0.05)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "TRAINFLEET_RUN_ID": "r9", "TORCH_FR_BUFFER_SIZE": "100"}  # fmt: skip
    argv = [sys.executable, "-u", str(shim_copy), str(script)]
    rank = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)  # fmt: skip
    try:
        assert rank.stdout.readline() == "ready\n"
        cluster = load_cluster()
        host = cluster.nodes[0].host
        deadline = time.monotonic() + 30
        while True:  # gloo's completions reach the recorder late under load (seen: 1 of 3)
            dump = dump_stacks(cluster, {host: {0: rank.pid}})[host]
            record, rest = stacks.take_flight_record(stacks.split_dump(dump)[0])
            assert record is not None, dump
            done = record["pg_status"]["0"]["last_completed_collective"]
            if done == "3" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert "@@flight" not in rest and rest.startswith("State:")
        assert done == "3", record
        assert [e["profiling_name"] for e in record["entries"]] == ["gloo:all_reduce"] * 3
        assert record["entries"][-1]["input_sizes"] == [[7]]
        assert collectives.stuck_collectives({0: record}, world_size=1) == []
        said = collectives.none_stuck({0: record}, {0: host})
        assert said.startswith("no collective pending on the 1 rank(s)"), said
    finally:
        rank.kill()
        rank.wait()


def test_a_flight_record_is_asked_for_only_in_a_private_directory_of_this_user(tmp_path):
    """The pid comes from a rank's heartbeat: a process whose shim.py lies in a directory
    others can write gets no request written there."""
    from trainfleet.node import procs

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "shim.py").write_text("import time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(shared / "shim.py")])
    try:
        deadline = time.monotonic() + 10
        while str(shared / "shim.py") not in cmdlines().get(proc.pid, ""):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert procs.shim_dir(proc.pid) is None
        assert procs.flight_records({"0": proc.pid}) == {}
        assert not (shared / "flight").exists()
        shared.chmod(0o700)
        assert procs.shim_dir(proc.pid) == str(shared)
    finally:
        proc.kill()
        proc.wait()


def test_the_shims_heartbeat_is_the_line_trainfleet_heartbeat_writes(monkeypatch, capsys):
    """The shim runs on nodes without trainfleet installed, so it writes beats itself (for
    Hugging Face Trainers): the same line, which the launcher reads the same way."""
    import io

    from trainfleet import heartbeat

    monkeypatch.setenv("TRAINFLEET_RUN_ID", "r5")
    monkeypatch.setenv("RANK", "3")
    shim.beat(7, total_steps=10, loss=1.25, busy_s=None)
    from_shim = capsys.readouterr().err
    ours = io.StringIO()
    heartbeat.beat(7, total_steps=10, loss=1.25, stream=ours)
    assert from_shim == ours.getvalue()
    mark, run_id, kind, rank, payload = from_shim.rstrip("\n").split(":", 4)
    assert (mark, run_id, kind, rank) == ("@@trainfleet", "r5", "beat", "3")
    assert heartbeat.parse(payload)["step"] == 7


def test_an_unchanged_trainer_beats_its_evaluations_and_saves(monkeypatch, tmp_path):
    """A Hugging Face Trainer run by `trainfleet launch` beats each evaluation batch and the
    bytes its checkpoint save has written, then `training` again, as `trainfleet train` does:
    an evaluation or a save longer than --hang-timeout (300 s by default) is no hang while it
    advances."""
    import threading
    import types

    beats_sent, written_seen = [], threading.Event()

    def beat(step, **fields):
        beats_sent.append((step, fields.get("phase"), fields.get("phase_progress")))
        if fields.get("phase_progress") == 1000:
            written_seen.set()

    class Callback:
        pass

    class Trainer:
        def __init__(self):
            self.callbacks = []
            self.state = types.SimpleNamespace(global_step=4, max_steps=10)
            self.args = types.SimpleNamespace(output_dir=str(tmp_path))

        def add_callback(self, callback):
            self.callbacks.append(callback)

        def _save_checkpoint(self, model, trial):
            folder = tmp_path / "checkpoint-4"
            folder.mkdir()
            (folder / "model.safetensors").write_bytes(b"w" * 1000)
            assert written_seen.wait(30), beats_sent  # a save that takes this long
            return "saved"

    callbacks = types.SimpleNamespace(TrainerCallback=Callback)
    monkeypatch.setitem(sys.modules, "transformers.trainer_callback", callbacks)
    monkeypatch.setattr(shim, "SAVE_BEAT_EVERY_S", 0.01)
    monkeypatch.setattr(shim, "beat", beat)
    shim.wrap_trainer(types.SimpleNamespace(Trainer=Trainer))
    trainer = Trainer()
    [beats] = trainer.callbacks
    for _ in range(2):
        beats.on_prediction_step(trainer.args, trainer.state, None)
    beats.on_evaluate(trainer.args, trainer.state, None)
    assert trainer._save_checkpoint(None, None) == "saved"
    assert beats_sent[:4] == [
        (4, "evaluating", 1), (4, "evaluating", 2), (4, "training", None), (4, "saving", 0)
    ]  # fmt: skip
    assert (4, "saving", 1000) in beats_sent and beats_sent[-1] == (4, "training", None)
