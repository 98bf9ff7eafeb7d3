"""`trainfleet status` on recorded status.json files (tests/unit/fixtures/status/): stragglers
by busy_s with their margin, ETA, silent ranks, finding the run dir, bad files, exit codes,
`--json` against the human view, `--follow` to the end of a run."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from pathlib import Path

import pytest

from trainfleet.cli.main import main
from trainfleet.errors import TrainfleetError
from trainfleet.status import find_status_file, read_view, render
from trainfleet.status.rules import MARGIN, SILENT_MIN_S, build_view
from trainfleet.status.rundir import KNOWN_STATES, VERSION, load_status

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "status"
# When each recording is looked at: a little after its last rewrite.
NOW = {
    "running_straggler": 1740823760.4,
    "done": 1740832312.3,
    "hung": 1740831500.0,
    "no_busy": 1740838250.3,
    "not_beaten": 1740844841.2,
}


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def view_of(name: str, **kwargs):
    return read_view(FIXTURES / f"{name}.json", now=NOW[name], **kwargs)


def write_run(run_dir: Path, doc: dict, *, updated_at: float | None = None) -> Path:
    """doc into run_dir/status.json, atomically as the launcher does; with updated_at, every
    time in it shifted so that its last rewrite is then."""
    doc = copy.deepcopy(doc)
    if updated_at is not None:
        shift = updated_at - doc["updated_at"]
        times = [(doc, "started_at"), (doc, "updated_at"), (doc["hang"] or {}, "detected_at")]
        times += [(row, "last_beat_at") for row in doc["ranks"]]
        times += [(restart, "at") for restart in doc["restarts"]]
        for holder, key in times:
            if holder.get(key) is not None:
                holder[key] += shift
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".status.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, run_dir / "status.json")
    return run_dir / "status.json"


def test_the_straggler_is_named_with_its_margin():
    view = view_of("running_straggler")
    assert (view.straggler_check, view.stragglers, view.reference_busy_s) == ("ok", [3], 0.805)
    others = sorted(r.median_busy_s for r in view.ranks[:3])[1]  # the other ranks' median
    assert view.ranks[3].others_busy_s == others
    assert view.ranks[3].slower_by == pytest.approx(1.05 / others - 1, abs=1e-3)
    assert [r.straggler for r in view.ranks] == [False, False, False, True]
    assert MARGIN == 0.2 and view.margin == 0.2
    (note,) = [n for n in view.notes if n.startswith("straggler:")]
    assert (
        "rank 3 (gpu-node-2)" in note
        and "31% above the median of the other ranks (0.8 s" in note
        and "margin 20%" in note
    )
    assert "STRAGGLER +31%" in render(view)
    # 31% slower is no straggler under a 35% margin.
    assert view_of("running_straggler", margin=0.35).stragglers == []


def test_eta_is_steps_left_times_the_median_step_time():
    view = view_of("running_straggler")
    assert view.ranks[0].median_step_s == 1.5
    assert view.ranks[0].eta_s == (1000 - 600) * 1.5
    assert view.ranks[1].eta_s == (1000 - 599) * 1.5  # rank 1 is a step behind
    assert view.eta_s == 601.5  # the job's: its slowest rank's
    assert "ETA 10m02s" in render(view).splitlines()[0]
    assert view_of("done").eta_s is None and view_of("hung").eta_s is None


def test_since_the_last_heartbeat_counts_to_now_while_running_and_to_the_end_after():
    running = view_of("running_straggler")
    assert [r.since_beat_s for r in running.ranks] == [0.8, 1.9, 0.6, 0.7]
    later = build_view(recorded("done"), now=NOW["done"] + 86400)
    assert [r.since_beat_s for r in later.ranks] == [2.1, 1.9]  # updated_at - last_beat_at
    assert later.elapsed_s == 1512.3 and later.silent == []


def test_a_rank_that_stopped_beating_is_silent_and_step_times_make_no_straggler():
    view = view_of("no_busy")
    assert view.silent == [1] and view.ranks[1].since_beat_s == 95.3
    assert any(n.startswith("silent: rank 1 (node-a): no heartbeat for 1m35s") for n in view.notes)
    # Rank 1's steps took longer, but without busy_s nobody is judged a straggler.
    assert view.straggler_check == "no busy_s" and view.stragglers == []
    assert any("cannot be told without busy_s" in n for n in view.notes)
    assert "SILENT" in render(view) and "STRAGGLER" not in render(view)


@pytest.mark.parametrize(
    ("median_step", "since", "silent"),
    [(10.0, 49.0, False), (10.0, 51.0, True), (1.0, SILENT_MIN_S - 1, False), (1.0, 31.0, True)],
)
def test_silent_is_five_median_steps_and_at_least_30_s(median_step, since, silent):
    doc = recorded("running_straggler")
    doc["ranks"][0]["step_times_s"] = [median_step] * 5
    doc["ranks"][0]["last_beat_at"] = doc["updated_at"] - since
    assert build_view(doc, now=doc["updated_at"]).ranks[0].silent is silent


def test_a_rank_saving_a_checkpoint_is_not_silent():
    doc = recorded("running_straggler")
    doc["ranks"][0].update(phase="saving", last_beat_at=doc["updated_at"] - 120)
    view = build_view(doc, now=doc["updated_at"])
    assert view.silent == [] and view.ranks[0].phase == "saving"
    assert "rank 0 (gpu-node-1) is saving: no new step for 2m00s, not silent" in view.notes[1]
    assert "  saving" in render(view).splitlines()[5]
    doc["ranks"][0]["phase"] = "training"
    assert build_view(doc, now=doc["updated_at"]).silent == [0]


def test_one_rank_has_no_one_to_straggle_behind():
    doc = recorded("running_straggler")
    doc["ranks"], doc["world_size"], doc["nodes"] = doc["ranks"][3:], 1, {}
    view = build_view(doc, now=NOW["running_straggler"])
    assert (view.straggler_check, view.stragglers, view.notes) == ("one rank", [], [])


def test_a_rank_without_a_heartbeat_yet_is_shown_not_flagged():
    view = view_of("not_beaten")
    rank3 = view.ranks[3]
    assert (rank3.step, rank3.since_beat_s, rank3.eta_s, rank3.silent) == (None, None, None, False)
    assert view.not_beaten == [3] and view.step == 2
    assert view.eta_s == pytest.approx(998 * 3.1)
    assert view.straggler_check == "too few samples"
    assert any(n.startswith("no heartbeat from rank 3 yet") for n in view.notes)
    assert "no beat yet" in render(view)


def test_a_hung_run_shows_the_watchdog_finding_and_its_restarts():
    view = view_of("hung")
    assert (view.state, view.exit_code, view.restarts, view.silent) == ("hung", 1, 1, [])
    text = render(view)
    assert "hang: no rank advanced for 5m00s (hang timeout 5m00s), detected 1m40s ago" in text
    assert "behind: rank 2 (gpu-node-2): stopped (SIGSTOP or a debugger)" in text
    assert ("stuck in all_reduce #4977 of process group 0 (default_pg), input sizes [[262144]]"
            " BFloat16: entered by ranks 0 (gpu-node-1), 1 (gpu-node-1), 3 (gpu-node-2); no record"
            " from rank 2 (gpu-node-2)") in text  # fmt: skip
    assert "restarts 1 (last: attempt 1, 16m20s ago: gpu-node-2 rank 3: RuntimeError" in text


def test_a_file_no_longer_rewritten_says_its_launcher_is_gone():
    view = build_view(recorded("running_straggler"), now=NOW["running_straggler"] + 60)
    assert view.stale and view.exit_code == 0  # the exit code follows the recorded state
    assert view.notes[0].startswith("status.json was last rewritten 1m00s ago")
    assert not view_of("running_straggler").stale


def test_a_launcher_that_ended_on_this_host_is_seen_at_once(tmp_path):
    """status.json names its launcher (host, pid, the pid's start time): on that host, no
    process with both makes the view stale at once, not 30 s later; a live launcher, another
    host or a file without the field leave it to the file's age."""
    import socket
    import subprocess
    import sys

    from trainfleet.localprocs import pid_start
    from trainfleet.status import launcher_gone

    host = socket.gethostname()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        launcher = {"host": host, "pid": alive.pid, "pid_start": pid_start(alive.pid)}
        assert launcher_gone(launcher) is False
        assert launcher_gone(dict(launcher, pid_start=launcher["pid_start"] - 1)) is True  # reused
        assert launcher_gone(dict(launcher, host="elsewhere")) is None
        assert launcher_gone(None) is None
    finally:
        alive.kill()
        alive.wait()
    doc = dict(recorded("running_straggler"), launcher=launcher)
    path = write_run(tmp_path / "run", doc, updated_at=time.time())
    view = read_view(path)
    assert view.stale and view.launcher_gone and view.updated_ago_s < 5
    assert view.notes[0] == (
        f"the launcher (pid {alive.pid} on {host}) is no longer running: this is its last word,"
        " not the job's state now"
    )
    ended_run = write_run(tmp_path / "done", dict(recorded("done"), launcher=launcher))
    assert not read_view(ended_run).stale  # an ended run's launcher is meant to be gone


def test_nodes_fold_their_ranks():
    one, two = view_of("running_straggler").nodes
    assert (one.node, one.min_step, one.max_step, one.slowest_rank) == ("gpu-node-1", 599, 600, 1)
    assert (two.node, two.slowest_rank, two.flagged) == ("gpu-node-2", 3, [3])
    assert one.tokens_per_s == round(12410.5 + 12398.0, 1) and one.memory_bytes == 33500000000


def test_above_16_ranks_one_row_per_node_then_the_flagged_ranks():
    doc = recorded("running_straggler")
    base = doc["ranks"][0]
    doc["ranks"] = [dict(base, rank=r, node=f"gpu-node-{r // 8 + 1}") for r in range(32)]
    doc["ranks"][13]["busy_times_s"] = [1.2] * 7
    doc["world_size"], doc["nodes"] = 32, {}
    lines = render(build_view(doc, now=NOW["running_straggler"])).splitlines()
    rows = [line for line in lines if line.startswith("gpu-node-")]
    assert [row.split()[:2] for row in rows] == [
        ["gpu-node-1", "0-7"],
        ["gpu-node-2", "8-15"],
        ["gpu-node-3", "16-23"],
        ["gpu-node-4", "24-31"],
        ["gpu-node-2", "13"],  # the flagged rank's own row
    ]
    assert rows[1].endswith("1 flagged: 13") and lines[lines.index("flagged ranks:") - 1] == ""


def test_run_dir_of_a_launch_given_or_found_from_where_it_ran(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "trainfleet-runs" / "20250301-101640-ab12"
    path = write_run(run_dir, recorded("running_straggler"))
    assert find_status_file(run_dir, cwd=Path("/")) == path
    assert find_status_file(Path("trainfleet-runs"), cwd=tmp_path) == path
    assert find_status_file(None, cwd=tmp_path) == path
    assert find_status_file(None, cwd=run_dir) == path  # from the run directory itself
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "20250301-101640-ab12"


def test_a_restarted_launch_run_dir_gives_its_latest_attempt(tmp_path):
    """`launch --run-dir job --max-restarts 10` runs attempts in job.restart-1 ... -10: the
    latest by number (10 sorts before 2 as text); the first attempt's file, passed itself."""
    first = write_run(tmp_path / "job", recorded("hung"))
    for n in (1, 2, 10):
        write_run(tmp_path / f"job.restart-{n}", dict(recorded("running_straggler")))
    (tmp_path / "job.restart-11").mkdir()  # started, no status.json yet
    latest = tmp_path / "job.restart-10" / "status.json"
    assert find_status_file(Path("job"), cwd=tmp_path) == latest
    assert find_status_file(Path("job/status.json"), cwd=tmp_path) == first
    assert find_status_file(Path("job.restart-2"), cwd=tmp_path).parent.name == "job.restart-2"


def test_a_requeued_slurm_job_s_run_dir_gives_its_latest_start_and_restart(tmp_path):
    """`--requeue`: start N of the Slurm job in job.requeue-N, its --max-restarts attempts in
    job.requeue-N.restart-M; a name that only begins like it is another run's."""
    write_run(tmp_path / "job", recorded("hung"))
    for name in ("job.restart-3", "job.requeue-1", "job.requeue-2", "job.requeue-2.restart-1",
                 "job.requeue-10x", "job.old"):  # fmt: skip
        write_run(tmp_path / name, dict(recorded("running_straggler")))
    latest = tmp_path / "job.requeue-2.restart-1" / "status.json"
    assert find_status_file(Path("job"), cwd=tmp_path) == latest


def test_a_train_output_gives_its_newest_run(tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    for run_id, started in [("a", 100.0), ("b", 300.0), ("c", 200.0)]:
        doc = dict(recorded("done"), run_id=run_id, started_at=started)
        write_run(output / "runs" / run_id, doc)
    os.utime(output / "runs" / "a" / "status.json", (1e10, 1e10))  # the start decides, not mtime
    (output / "runs" / "d").mkdir()  # a run that never wrote a status.json
    assert find_status_file(output, cwd=tmp_path) == output / "runs" / "b" / "status.json"
    monkeypatch.chdir(output)
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "b"


def test_no_run_found_says_how_to_pass_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"trainfleet: no run found from here ({tmp_path}): no status.json")
    assert "trainfleet status RUN_DIR" in err and "trainfleet-runs/RUN_ID" in err
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert main(["status", "."]) == 1
    assert "(1 run dir(s) there have none)" in capsys.readouterr().err
    assert main(["status", "nowhere"]) == 1
    assert capsys.readouterr().err.startswith("trainfleet: nowhere: no such directory: pass")


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ('{"version": 1, "run_id": ', "not valid JSON"),
        ('{"version": 2}', "status.json version 2, this trainfleet reads version 1: upgrade"),
        ("[]", "a JSON list, not an object"),
        ('{"version": 1, "run_id": "r"}', "`state` is None"),
    ],
)
def test_a_bad_status_file_is_an_error_naming_it(tmp_path, capsys, content, what):
    (tmp_path / "status.json").write_text(content)
    assert main(["status", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"trainfleet: {tmp_path / 'status.json'}: ") and what in err


def test_bad_fields_unknown_states_and_a_vanished_file(tmp_path):
    doc = recorded("running_straggler")
    del doc["ranks"][2]["node"]
    with pytest.raises(TrainfleetError, match=r"ranks\[2\]\.node is None"):
        load_status(write_run(tmp_path, doc))
    with pytest.raises(TrainfleetError, match="unknown state 'paused'") as err:
        load_status(write_run(tmp_path, dict(recorded("done"), state="paused")))
    assert err.value.fix.startswith("upgrade trainfleet")
    with pytest.raises(TrainfleetError, match="no such file"):
        load_status(tmp_path / "gone" / "status.json")


@pytest.mark.parametrize(
    ("state", "code"),
    [("starting", 0), ("running", 0), ("done", 0)]
    + [(s, 1) for s in ("failed", "stalled", "hung", "interrupted")],
)
def test_exit_code_by_state(tmp_path, capsys, state, code):
    write_run(tmp_path, dict(recorded("done"), state=state))
    assert main(["status", str(tmp_path)]) == code
    assert capsys.readouterr().out.startswith(f"run 20250301-093320-77f0: {state}, step 1000")


def test_json_is_the_data_the_human_view_renders(tmp_path, monkeypatch, capsys):
    write_run(tmp_path, recorded("running_straggler"))
    monkeypatch.setattr(time, "time", lambda: NOW["running_straggler"])
    assert main(["status", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["status", str(tmp_path)]) == 0
    human = capsys.readouterr().out
    view = read_view(tmp_path / "status.json", now=NOW["running_straggler"])
    assert data == json.loads(json.dumps(view.to_json())) and human == render(view) + "\n"
    assert data["stragglers"] == [3] and data["ranks"][3]["slower_by"] == 0.312
    assert data["eta_s"] == 601.5 and data["exit_code"] == 0
    assert "gpu-node-2     2  600/1000      0.6 s     12.4k  31.3 GiB  0.80 s  10m00s" in human


@pytest.mark.parametrize("as_json", [False, True])
def test_follow_redraws_until_the_run_ends_then_exits(tmp_path, capsys, as_json):
    running = recorded("running_straggler")
    write_run(tmp_path, running, updated_at=time.time())
    argv = ["status", str(tmp_path), "--follow", "--interval", "0.1"] + ["--json"] * as_json
    codes: list[int] = []
    follower = threading.Thread(target=lambda: codes.append(main(argv)), daemon=True)
    follower.start()
    time.sleep(0.5)
    assert follower.is_alive()  # still following the running job
    write_run(tmp_path, dict(running, state="done"), updated_at=time.time())
    follower.join(timeout=5)
    assert not follower.is_alive() and codes == [0]
    out = capsys.readouterr().out
    if as_json:
        states = [json.loads(line)["state"] for line in out.splitlines()]
        assert len(states) >= 3 and set(states[:-1]) == {"running"} and states[-1] == "done"
    else:
        views = out.split("run 20250301-101640-ab12: ")[1:]
        assert len(views) >= 3 and all(v.startswith("running") for v in views[:-1])
        assert views[-1].startswith("done, step 599/1000") and "ended" in views[-1]


def test_a_status_json_written_by_the_launcher_reads(tmp_path):
    from trainfleet.launch.progress import VERSION as WRITTEN
    from trainfleet.launch.progress import Progress
    from trainfleet.launch.result import RunState

    assert WRITTEN == VERSION and {s.value for s in RunState} <= set(KNOWN_STATES)
    progress = Progress(run_id="r1", ranks={"n1": range(0, 2)}, started_at=1000.0)
    for step in range(1, 8):
        for rank, busy in ((0, 0.5), (1, 0.9)):
            fields = {"step": step, "total_steps": 20, "busy_s": busy, "phase": "training"}
            progress.beat(rank, fields, now=1000.0 + 2 * step + rank / 10)
    progress.write(tmp_path / "status.json", state="running", now=1015.0)
    view = read_view(tmp_path / "status.json", now=1015.0)
    assert (view.step, view.total_steps, view.eta_s) == (7, 20, 26.0)  # 13 steps x 2 s
    assert view.reference_busy_s == 0.7 and view.stragglers == [1]
    assert view.ranks[1].phase == "training" and view.silent == []


def test_help_and_a_bad_interval(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trainfleet status") and "Exit code: 0 when" in out
    assert main(["status", "--follow", "--interval", "0"]) == 1
    assert "--interval 0.0: must be > 0" in capsys.readouterr().err


def _with_escapes() -> dict:
    """The hung run, where what nodes said holds escape sequences (F9): a rank's phase, where a
    hung rank waits, the op of the collective it is stuck in."""
    doc = recorded("hung")
    doc["ranks"][0]["phase"] = "saving\x1b[2K\r\x1b[32mall ranks healthy\x1b[2J"
    doc["hang"]["behind"][0]["where"] = "wait\x1b]0;pwned\x07 (x.py:1)"
    doc["hang"]["collectives"][0]["op"] = "all_reduce\x1b[2J"
    return doc


def test_the_human_view_shows_what_nodes_said_as_text_never_as_escape_sequences(tmp_path, capsys):
    write_run(tmp_path, _with_escapes())
    assert main(["status", str(tmp_path)]) == 1  # hung
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "saving?[2K??[32mall ranks healthy?[2J" in out  # the phase, as text
    assert "behind: rank 2 (gpu-node-2): wait?]0;pwned? (x.py:1)" in out
    assert "stuck in all_reduce?[2J #4977" in out


def test_status_json_keeps_what_nodes_said_with_control_characters_escaped(tmp_path, capsys):
    doc = _with_escapes()
    write_run(tmp_path, doc)
    main(["status", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert not any(ord(c) < 0x20 for c in out.rstrip("\n"))  # JSON's \u001b, not ESC
    data = json.loads(out)
    assert data["ranks"][0]["phase"] == doc["ranks"][0]["phase"]  # the text, kept whole
    assert data["hang"]["behind"][0]["where"] == doc["hang"]["behind"][0]["where"]


def test_the_hang_record_reads_what_launchers_wrote_and_writes_back_the_same_keys(tmp_path):
    """status.json's `hang` as this launcher writes it (at detection, then with the dumps),
    as the first launchers wrote it (no phase, no collectives), the recorded fixture's (stacks
    as a list), and values of the wrong type (read as unknown, never an error)."""
    from trainfleet.launch.progress import Progress
    from trainfleet.status.hang import Behind, Hang, StackReport

    detected = {"stuck_s": 31.2, "detected_at": 1000.5, "phase": "startup"}
    dumped = {**detected, "step": None, "behind": [{"node": "n1", "rank": 1, "where": "w (x.py)"}],
              "stacks": "runs/r1/stacks", "collectives": [{"op": "all_reduce"}],
              "flight_records": [0]}  # fmt: skip
    first = {"stuck_s": 3.0, "step": 4, "behind": [{"node": "n1", "rank": 0, "where": "w"}],
             "stacks": "runs/r0/stacks", "detected_at": 2.0}  # fmt: skip
    for written in (detected, dumped, first, recorded("hung")["hang"]):
        assert Hang.from_json(written).to_json() == written
    assert Hang.from_json(detected).report is None and Hang.from_json(first).phase is None
    odd = Hang.from_json({"stuck_s": "long", "behind": [2, "x"], "collectives": [1, {"op": "b"}]})
    assert (odd.stuck_s, odd.report.collectives, odd.report.flight_records) == (
        None,
        ({"op": "b"},),
        None,
    )
    assert odd.behind == (
        Behind(node=None, rank=2, where=None),
        Behind(node=None, rank=None, where=None),
    )

    progress = Progress(run_id="r1", ranks={"n1": range(0, 2)}, started_at=1000.0)
    progress.beat(0, {"step": 1}, now=1001.0)
    progress.hang = Hang.from_json(detected).dumped(Hang.from_json(dumped).report)
    assert isinstance(progress.hang.report, StackReport)
    progress.write(tmp_path / "status.json", state="hung", now=1040.0)
    assert json.loads((tmp_path / "status.json").read_text())["hang"] == dumped
    assert read_view(tmp_path / "status.json", now=1050.0).hang == progress.hang
