"""`trainfleet launch` on real sandboxes: real sshd, real torchrun, real gloo. Each test runs the
CLI as a separate process (as a user would, so that Ctrl-C and a killed ssh are real) and checks
afterwards that no process of the job is left on any node."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from session_scope import own_cmdlines
from trainfleet.examples import ALLREDUCE as ALLREDUCE_SCRIPT
from trainfleet.examples import HEARTBEAT_LOOP

pytestmark = pytest.mark.cluster

SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = str(ALLREDUCE_SCRIPT)
IFNAMES = ["ens14f0", "ens14f1", "ens14f2"]
BACKENDS = [
    "ssh",
    pytest.param(
        "deepspeed",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("deepspeed") is None,
            reason="deepspeed is not installed (`make venv` installs it)",
        ),
    ),
]


def _launch(cluster_file, run_dir, *args, script=ALLREDUCE, script_args=(), env=None, **popen):
    argv = [
        sys.executable,
        "-m",
        "trainfleet",
        "launch",
        "-c",
        str(cluster_file),
        "--run-dir",
        str(run_dir),
        *args,
        "--",
        str(SCRIPTS / script),  # (an absolute path stays as it is)
        *script_args,
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        **popen,
    )
    _running.append(proc)
    return proc


def _finish(proc, timeout=180) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _job_processes() -> list[str]:
    """Command lines of any bootstrap, torchrun or rank of a launch this test process started,
    still running here or on its sandboxes' nodes (they share this machine's process table)."""
    marks = ("trainfleet-bootstrap", str(SCRIPTS), ALLREDUCE, str(HEARTBEAT_LOOP))
    return [f"{pid}: {c[:200]}" for pid, c in own_cmdlines().items() if any(m in c for m in marks)]


_running: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_job_left_behind(make_sandbox):
    """After each test (before its sandbox goes down): a launch still running is interrupted,
    and no process of any job may be left."""
    yield
    for proc in _running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    _running.clear()
    deadline = time.monotonic() + 5
    while _job_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_processes() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_allreduce_on_three_nodes_with_different_interface_names_and_decoys(
    make_sandbox, tmp_path, backend
):
    box = make_sandbox(nodes=3, ifnames=IFNAMES, slots=2, faults=["decoy-iface@2"])
    code, out = _finish(_launch(box.cluster_file, tmp_path / "run", f"--backend={backend}"))
    assert code == 0, out
    for rank, node in enumerate(["gpu-node-1"] * 2 + ["gpu-node-2"] * 2 + ["gpu-node-3"] * 2):
        said = f"rank {rank}/6 sum=21.0 GLOO_SOCKET_IFNAME={IFNAMES[rank // 2]}"
        assert re.search(rf"^\[{node}:{rank}\] +{said}$", out, re.MULTILINE), out
    assert "done after" in out and "all 6 rank(s) on 3 node(s) finished" in out
    log = (tmp_path / "run" / "logs" / "gpu-node-2.rank3.log").read_text()
    assert "rank 3/6 sum=21.0 GLOO_SOCKET_IFNAME=ens14f1" in log
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    assert not list(Path("/tmp").glob(f"trainfleet-{run_id}*"))  # node-side files removed


def test_firewall_stops_the_launch_in_preflight_and_without_it_the_join_watchdog_explains(
    make_sandbox, tmp_path
):
    box = make_sandbox(nodes=3, faults=["firewall-blocks-ports@1"])
    code, out = _finish(_launch(box.cluster_file, tmp_path / "pre"))
    assert code == 1
    assert "preflight doctor found errors" in out and "firewall-blocks-ports  [gpu-node-1]" in out
    fix = f"trainfleet setup firewall --apply -c {box.cluster_file}"
    assert f"fix with:\n  {fix}   (firewall-blocks-ports on gpu-node-1)" in out, out
    assert not (tmp_path / "pre").exists()  # nothing was started

    # The ranks cannot join at all here (gpu-node-1 drops every port but ssh), so the watchdog's
    # bound only sets how long the test waits for it: 5 s shows what 10 s did.
    join_timeout = 5
    started = time.monotonic()
    proc = _launch(
        box.cluster_file, tmp_path / "run", "--no-preflight", f"--join-timeout={join_timeout}"
    )
    code, out = _finish(proc)
    elapsed = time.monotonic() - started
    assert code == 1, out
    assert f"not every rank joined the rendezvous within {join_timeout} s" in out
    assert "firewall-blocks-ports  [gpu-node-1]" in out and "iptables -I INPUT" in out
    assert elapsed < join_timeout + 30, f"diagnosis took {elapsed:.0f} s"


def test_loopback_hostname_and_busy_master_port_are_handled(make_sandbox, tmp_path):
    box = make_sandbox(nodes=3, faults=["hostname-loopback@2", "port-in-use@1"])
    code, out = _finish(_launch(box.cluster_file, tmp_path / "run"))
    assert code == 0, out
    assert "master port 29500 is taken on the master" in out and "using 29501" in out
    assert "[gpu-node-2:1] rank 1/3 sum=6.0" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_that_exits_3_stops_every_node_and_is_named_as_the_root_cause(
    make_sandbox, tmp_path, backend
):
    box = make_sandbox(nodes=3, slots=2)
    run = _launch(box.cluster_file, tmp_path / "run", f"--backend={backend}", script="fail_rank.py")
    code, out = _finish(run)
    assert code == 3, out
    # The rank's own exit code (the shim reports it): neither torchrun's nor DeepSpeed's
    # launcher exits with it.
    assert "root cause: gpu-node-2 rank 3: rank 3 exited with code 3" in out, out
    # Every rank on every node ended within 10 s of the failure (the others would run 120 s):
    # the launcher's log and the rank's log share one clock (seconds since the start).
    logs = tmp_path / "run" / "logs"
    gave_up = next(
        float(line.split()[0])
        for line in (logs / "gpu-node-2.rank3.log").read_text().splitlines()
        if "giving up" in line
    )
    stopped = next(
        float(line.split()[0])
        for line in (logs / "launch.log").read_text().splitlines()
        if "every rank on every node stopped" in line
    )
    assert stopped - gave_up < 10, (gave_up, stopped)


def _wait_for(path: Path, text: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_ctrl_c_stops_every_rank_on_every_node(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2)
    proc = _launch(box.cluster_file, tmp_path / "run", script="long.py")
    _wait_for(tmp_path / "run" / "logs" / "gpu-node-2.rank1.log", "joined")
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    code, out = _finish(proc, timeout=60)
    assert code == 130, out
    assert "interrupted: stopping every rank on every node" in out
    assert time.monotonic() - started < 10


def test_a_killed_node_connection_stops_the_run(make_sandbox, tmp_path):
    box = make_sandbox(nodes=3)
    proc = _launch(box.cluster_file, tmp_path / "run", script="long.py")
    _wait_for(tmp_path / "run" / "logs" / "gpu-node-3.rank2.log", "joined")
    ssh = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "ssh .*gpu-node-3"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert len(ssh) == 1, ssh
    os.kill(int(ssh[0]), signal.SIGKILL)
    code, out = _finish(proc, timeout=60)
    assert code != 0, out
    assert "gpu-node-3 failed" in out and "stopping every rank on every node" in out


def test_a_node_cut_off_by_a_link_down_stops_its_own_ranks(make_sandbox, tmp_path):
    """gpu-node-2's link goes down and stays down: the launcher gives up on it after ssh's
    keepalive (15 s) and cannot reach it to stop anything; the node's bootstrap, hearing no
    keepalive for LIFELINE_S, stops its ranks itself, while the link is still down."""
    from trainfleet.launch.backend import KEEPALIVE_EVERY_S, LIFELINE_S
    from trainfleet.sandbox.netns import netns_pids

    box = make_sandbox(nodes=2)
    proc = _launch(box.cluster_file, tmp_path / "run", script="long.py")
    _wait_for(tmp_path / "run" / "logs" / "gpu-node-2.rank1.log", "joined")
    node = box.node(2)
    link = ["ip", "-n", node.netns, "link", "set", node.ifname]

    def left_on_node_2() -> list[str]:
        return [p for p in _job_processes() if int(p.split(":")[0]) in netns_pids(node.netns)]

    assert left_on_node_2()
    cut = time.monotonic()
    subprocess.run([*link, "down"], check=True)
    try:
        code, out = _finish(proc, timeout=60)
        assert code != 0 and "gpu-node-2 failed (its connection dropped)" in out, out
        assert "but gpu-node-2 could not confirm it (connection lost)" in out, out
        assert "every rank on every node stopped" not in out
        while left_on_node_2() and time.monotonic() - cut < LIFELINE_S + 10:
            time.sleep(0.5)
        assert left_on_node_2() == [], time.monotonic() - cut
        # The lifeline runs from the last keepalive that arrived, up to KEEPALIVE_EVERY_S
        # before the cut.
        assert LIFELINE_S - KEEPALIVE_EVERY_S <= time.monotonic() - cut < LIFELINE_S + 10
    finally:
        subprocess.run([*link, "up"], check=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stopped_rank_is_found_by_the_hang_watchdog_with_every_stack(
    make_sandbox, tmp_path, backend
):
    """Rank 1 SIGSTOPs itself at step 20 (hang_rank.py); gloo would wait 30 minutes. With
    --hang-timeout 3 the run is HUNG about 3 s after the last step: every rank's stack is
    dumped, the stopped rank is named as stopped and the other as waiting in its all_reduce,
    status.json says so, and nothing of the job is left (the fixture)."""
    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, f"--backend={backend}", "--hang-timeout", "3",
                   script="hang_rank.py")  # fmt: skip
    code, out = _finish(proc, timeout=120)
    assert code == 1, out
    assert "no rank advanced a step for 3 s" in out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "hung"
    last_beat = max(r["last_beat_at"] for r in status["ranks"])
    detected = status["hang"]["detected_at"]
    assert 3 <= detected - last_beat < 3 + 3, (detected, last_beat)  # timeout + watch period + dump
    behind = {b["rank"]: b for b in status["hang"]["behind"]}
    assert sorted(behind) == [0, 1] and status["hang"]["step"] == 19  # both beat 19, neither 20
    assert behind[1]["where"].startswith("stopped (SIGSTOP"), behind
    assert "all_reduce" in behind[0]["where"], behind
    assert "rank-hung: no rank advanced past step 19" in out
    stacks = sorted(p.name for p in (run_dir / "stacks").iterdir())
    assert stacks == ["gpu-node-1.rank0.txt", "gpu-node-2.rank1.txt"]
    # The Flight Recorder: rank 0 is in the 20th all_reduce; the stopped rank cannot answer.
    stuck = ("stuck in all_reduce #20 of process group 0 (default_pg), input sizes [[1]] Float:"
             " entered by rank 0 (gpu-node-1); no record from rank 1 (gpu-node-2)")  # fmt: skip
    assert stuck in out, out
    [collective] = status["hang"]["collectives"]
    assert (collective["entered"], collective["no_record"]) == ([0], [1]), collective
    assert sorted(p.name for p in (run_dir / "flight").iterdir()) == ["gpu-node-1.rank0.json"]


def test_a_startup_longer_than_the_hang_timeout_is_judged_by_its_own_bound(make_sandbox, tmp_path):
    """Each rank tokenizes for 6 s before step 1, beating its progress: under --hang-timeout 3
    that is no hang (startup has its own bound), and the run finishes. Then rank 1's
    tokenization stops advancing: with --startup-timeout 4 the run is HUNG in its startup, and
    the Flight Recorder names the barrier rank 0 waits in and rank 1 as never having entered
    it (alive, so its record answers)."""
    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, "--hang-timeout", "3", "--startup-timeout", "30",
                   script="slow_start.py", script_args=["6"])  # fmt: skip
    code, out = _finish(proc, timeout=120)
    assert code == 0, out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "done" and status["training_started_at"] is not None
    assert status["training_started_at"] - status["started_at"] > 6, status
    assert "no rank" not in out and "tokenized" in out

    run_dir = tmp_path / "stall"
    proc = _launch(box.cluster_file, run_dir, "--hang-timeout", "3", "--startup-timeout", "4",
                   script="slow_start.py", script_args=["2", "stall"])  # fmt: skip
    code, out = _finish(proc, timeout=120)
    assert code == 1, out
    assert "no rank made startup progress for 4 s (startup timeout 4 s)" in out, out
    assert "startup-timeout: no startup progress for 4 s, before the first step" in out, out
    stuck = ("stuck in barrier #1 of process group 0 (default_pg), input sizes []: entered by"
             " rank 0 (gpu-node-1); never entered by rank 1 (gpu-node-2)")  # fmt: skip
    assert stuck in out, out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["hang"]["phase"] == "startup" and status["training_started_at"] is None
    behind = {b["rank"]: b["where"] for b in status["hang"]["behind"]}
    assert "barrier" in behind[0] and "slow_start.py" in behind[1], behind
    records = sorted(p.name for p in (run_dir / "flight").iterdir())
    assert records == ["gpu-node-1.rank0.json", "gpu-node-2.rank1.json"]
    code, view = _status_json(run_dir)
    assert view["hang"]["collectives"][0]["never_entered"] == [1], view


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_restarts_starts_the_command_again_after_a_crash(make_sandbox, tmp_path, backend):
    """The last rank exits 3 in the first attempt only: with --max-restarts 2 the run is
    stopped, restarted once with TRAINFLEET_RESTART=1 on every rank, and ends done; the cause
    is logged in the first run dir's restarts.jsonl and carried into the second's status."""
    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, f"--backend={backend}", "--max-restarts", "2",
                   script="crash_until_restart.py", script_args=["1"])  # fmt: skip
    code, out = _finish(proc)
    assert code == 0, out
    assert "restart 1 of 2 after rank-crashed: gpu-node-2 rank 1: rank 1 exited with code 3" in out
    assert "finished with TRAINFLEET_RESTART=1" in out
    assert "restart 2 of 2" not in out
    restarts = [json.loads(x) for x in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [r["cause"].split(":")[0] for r in restarts] == ["rank-crashed"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
    second = json.loads((tmp_path / "run.restart-1" / "status.json").read_text())
    assert second["state"] == "done" and len(second["restarts"]) == 1
    code, view = _status_json(run_dir)  # the run dir the user gave: its latest attempt
    assert code == 0 and view["state"] == "done" and view["restarts"] == 1, view


def test_max_restarts_gives_up_with_every_cause(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, "--max-restarts", "1",
                   script="crash_until_restart.py", script_args=["9"])  # fmt: skip
    code, out = _finish(proc)
    assert code == 3, out
    assert "restart 1 of 1 after rank-crashed" in out
    assert "after 1 restart(s):\n  1. rank-crashed: gpu-node-2 rank 1" in out
    assert len((run_dir / "restarts.jsonl").read_text().splitlines()) == 1
    assert json.loads((tmp_path / "run.restart-1" / "status.json").read_text())["state"] == "failed"


def _status_json(run_dir: Path) -> tuple[int, dict | None]:
    """`trainfleet status RUN_DIR --json` from another process, as from another terminal."""
    done = subprocess.run(
        [sys.executable, "-m", "trainfleet", "status", str(run_dir), "--json"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None


@pytest.mark.serial
def test_a_node_throttled_mid_run_is_named_a_straggler_and_nothing_before_it_is(
    make_sandbox, tmp_path
):
    """heartbeat_loop.py with ~0.2 s of compute per step on 2 nodes: for 12 s nothing is slowed
    and no rank may be named. Then every process of gpu-node-2 gets 75% of one CPU (the
    sandbox's cpu-throttle cgroup, as a throttled or shared node would): the launcher names
    rank 1 `rank-straggler` within 60 s, and never rank 0."""
    from trainfleet.sandbox import cpu
    from trainfleet.sandbox.netns import netns_pids

    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, script=str(HEARTBEAT_LOOP),
                   script_args=["--steps", "100000", "--work", "384"])  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.monotonic(), x) for x in proc.stdout), daemon=True
    )
    reader.start()

    def wait_for(pattern: str, until: float) -> float | None:
        """When a line matching `pattern` came (looking from the start), None by `until`."""
        while time.monotonic() < until:
            hit = next((at for at, x in list(lines) if re.search(pattern, x)), None)
            if hit is not None:
                return hit
            assert proc.poll() is None, "".join(x for _, x in lines)
            time.sleep(0.2)
        return None

    status = run_dir / "status.json"
    deadline = time.monotonic() + 120
    while not status.exists() or not all(
        (r["step"] or 0) >= 5 for r in json.loads(status.read_text())["ranks"]
    ):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(x for _, x in lines)
        time.sleep(0.2)
    assert wait_for("rank-straggler", time.monotonic() + 12) is None, lines[-5:]
    throttled = time.monotonic()
    cpu.throttle(f"{cpu.cgroup_prefix(box.name)}2", netns_pids(box.node(2).netns))
    named = wait_for("rank-straggler", throttled + 60)
    said = "".join(x for _, x in lines)
    assert named is not None, said[-3000:]
    print(f"named {named - throttled:.1f} s after the throttle")  # (-s) for docs/status.md
    assert "rank-straggler: rank 1 (gpu-node-2) computes" in said, said[-3000:]
    assert "rank 0 (gpu-node-1) computes" not in said
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130


@pytest.mark.serial
def test_status_from_another_terminal_names_the_slow_rank_while_the_job_runs(
    make_sandbox, tmp_path
):
    """heartbeat_loop.py with rank 1 doing 4x the work of rank 0 per step: their step times
    are alike (every step waits for the slowest), their busy_s are not. While the job runs,
    `trainfleet status` sees heartbeats that came over ssh and flags rank 1, not rank 0; after
    the end it reads the same run as done."""
    box = make_sandbox(nodes=2, slots=1)
    run_dir = tmp_path / "run"
    proc = _launch(box.cluster_file, run_dir, script=str(HEARTBEAT_LOOP),
                   script_args=["--steps", "400", "--slow-rank", "1"])  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        code, view = _status_json(run_dir)
        if view and view["straggler_check"] == "ok":
            break
        assert proc.poll() is None and time.monotonic() < deadline, (code, view, proc.poll())
        time.sleep(0.5)
    assert code == 0 and view["state"] == "running", view
    assert not view["stale"] and view["launcher"]["pid"] == proc.pid  # alive, here
    assert view["step"] < 400
    assert view["stragglers"] == [1], view
    ranks = {r["rank"]: r for r in view["ranks"]}
    assert ranks[1]["straggler"] and not ranks[0]["straggler"]
    assert ranks[1]["median_busy_s"] > 1.5 * ranks[0]["median_busy_s"], ranks
    code, out = _finish(proc)
    assert code == 0, out
    code, after = _status_json(run_dir)
    assert code == 0 and after["state"] == "done" and after["step"] == 400, after
