"""`--backend slurm` from a login node: the batch script, the job's states as `scontrol`
reports them (recorded from the sandbox's Slurm 22.05), following a job's output, and the CLI's
checks before anything is submitted. The real submission runs in
tests/cluster/test_slurm_sandbox.py."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from trainfleet.cli.main import main
from trainfleet.cluster import load_cluster
from trainfleet.cluster.slurm import allocation
from trainfleet.errors import TrainfleetError
from trainfleet.launch import batch_job, follow_job, sbatch
from trainfleet.launch.backends import BACKENDS, default_for

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parent / "fixtures" / "slurm" / "scontrol-show-job.txt"


def _recorded() -> dict[str, str]:
    lines = [line for line in RECORDED.read_text().splitlines() if not line.startswith("#")]
    return {line.split()[0].removeprefix("JobId="): line for line in lines}


def test_the_script_asks_for_what_was_given_and_runs_the_same_command_from_the_same_place():
    request = sbatch.BatchRequest(nodes=4, partition="gpu", time="1-00", gpus_per_node="h100:8",
                                  account="team-a", job_name="sft-32b",
                                  sbatch_args=("--exclusive", "--exclude=gpu-node-3"))  # fmt: skip
    argv = ["/opt/venv/bin/python", "-m", "trainfleet", "launch", "--run-dir", "/home/me/r 1",
            "--backend", "slurm", "--nodes", "4", "--", "train.py", "--lr", "1e-4"]  # fmt: skip
    script = sbatch.batch_script(request, argv, cwd="/home/me/my project",
                                 output="/home/me/r 1/slurm-%j.out", written_by="t")  # fmt: skip
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=sft-32b",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=/home/me/r 1/slurm-%j.out",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-00",
        "#SBATCH --gpus-per-node=h100:8",
        "#SBATCH --account=team-a",
        "#SBATCH --exclusive",
        "#SBATCH --exclude=gpu-node-3",
    ]
    assert lines[-2:] == [
        "cd '/home/me/my project' || exit 1",
        "exec /opt/venv/bin/python -m trainfleet launch --run-dir '/home/me/r 1' --backend slurm"
        " --nodes 4 -- train.py --lr 1e-4",
    ]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("nodes", 0, "--nodes 0"),
        ("partition", "gpu; rm -rf ~", "is not a Slurm name"),
        ("time", "1 day", "is not a Slurm name"),
        ("sbatch_args", ("--exclusive\n#SBATCH --uid=0",), "one sbatch option on one line"),
        ("sbatch_args", ("exclusive",), "one sbatch option"),
    ],
)
def test_a_value_that_would_be_a_second_line_or_no_option_is_refused(field, value, said):
    with pytest.raises(TrainfleetError, match=said):
        sbatch.BatchRequest(**{"nodes": 2, field: value})


def test_each_recorded_end_gives_the_exit_code_a_shell_would():
    jobs = {job: batch_job.JobState.parse(line) for job, line in _recorded().items()}
    assert {job: (s.state, s.exit_code, s.nodes) for job, s in jobs.items() if s} == {
        "2": ("FAILED", 1, "gpu-node-[1-2]"),  # a rank crashed: trainfleet in the job exited 1
        "3": ("CANCELLED", 137, "gpu-node-[1-2]"),  # plain scancel: the script got SIGKILL
        "4": ("FAILED", 130, "gpu-node-[1-2]"),  # Ctrl-C: trainfleet stopped and exited 130
        "5": ("COMPLETED", 0, "gpu-node-[1-2]"),
    }
    assert all(state.ended for state in jobs.values() if state)
    assert batch_job.JobState.parse("JobState=PENDING Reason=Resources NodeList=(null)").said() == (
        "PENDING (Resources)"
    )
    assert batch_job.JobState.parse("slurm_load_jobs error: Invalid job id specified") is None


def test_following_prints_each_new_state_once_and_the_output_as_it_grows(tmp_path):
    output = tmp_path / "slurm-5.out"
    states = iter(["JobState=PENDING Reason=Priority NodeList=(null)",
                   "JobState=PENDING Reason=Priority NodeList=(null)",
                   "JobState=RUNNING Reason=None NodeList=n[1-2]",
                   "JobState=RUNNING Reason=None NodeList=n[1-2]",
                   _recorded()["5"]])  # fmt: skip
    writes = iter(["", "", "[n1:0] step 1", " of 2\n[n2:1] ready\n", "[n1:0] done"])

    def look_at(job: str) -> batch_job.JobState | None:
        with output.open("a") as handle:  # the job's output grows between two looks
            handle.write(next(writes))
        return batch_job.JobState.parse(next(states))

    out, said = io.StringIO(), []
    end = follow_job.follow("5", output, out=out, say=said.append, poll_s=0, look_at=look_at)
    assert said == ["job 5: PENDING (Priority)", "job 5: RUNNING on n[1-2]",
                    "job 5: COMPLETED on gpu-node-[1-2]"]  # fmt: skip
    # Whole lines as they come; the last one, without its newline, once the job has ended.
    assert out.getvalue() == "[n1:0] step 1 of 2\n[n2:1] ready\n[n1:0] done\n"
    assert (end.state, end.exit_code, end.cancelled_here) == ("COMPLETED", 0, False)


def test_a_job_slurm_forgot_ends_the_follow_with_where_to_look(tmp_path):
    gone = batch_job.JobState(state=batch_job.GONE)
    end = follow_job.follow("9", tmp_path / "none.out", out=io.StringIO(), say=lambda _: None,
                            poll_s=0, look_at=lambda _: gone)  # fmt: skip
    assert end.exit_code == 1 and "sacct -j JOB" in (end.why or "")


def test_inside_a_job_the_slurm_backend_is_the_default_and_outside_one_it_plans_nothing():
    job = allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-node-[1-2]"})
    assert default_for(load_cluster(slurm=job)) == "slurm"
    assert default_for(load_cluster(hosts="a,b")) == "ssh"
    with pytest.raises(TrainfleetError, match="a is not a node of one"):
        BACKENDS["slurm"].preflight(load_cluster(hosts="a,b"), read_only=True)


@pytest.fixture
def outside_slurm(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('hi')\n")
    return tmp_path


def test_the_dry_run_prints_the_script_that_runs_the_same_command_and_writes_nothing(
    outside_slurm, capsys
):
    code = main(["launch", "--backend", "slurm", "--nodes", "2", "--time", "30", "--dry-run",
                 "--run-dir", "r1", "--", "t.py", "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --time=30" in out
    # The job runs the command, not its dry run; the script's own --dry-run is its own.
    run_dir = outside_slurm / "r1"
    assert (f"-m trainfleet launch --run-dir {run_dir} --backend slurm --nodes 2 --time 30"
            f" --run-dir r1 -- t.py --dry-run\n") in out  # fmt: skip
    assert "then run: sbatch --parsable r1/job.sbatch" in out
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--nodes", "2"], "--nodes asks Slurm for the job, and this command runs no Slurm job"),
        (["--sbatch-arg=--exclusive"], "--sbatch-arg asks Slurm"),
        (["--backend", "slurm"], "needs --nodes"),
        (["--backend", "slurm", "--nodes", "2", "--hosts", "a,b"], "--hosts names nodes"),
        (["--backend", "slurm", "--nodes", "2", "-e", "a"], "-e names nodes"),
    ],
)
def test_slurm_options_that_would_do_nothing_or_clash_are_refused_before_anything_runs(
    outside_slurm, capsys, words, said
):
    assert main(["launch", *words, "--", "t.py"]) == 1
    assert said in capsys.readouterr().err
    assert not (outside_slurm / "trainfleet-runs").exists()


def test_inside_a_job_nodes_must_be_the_job_s(outside_slurm, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert main(["launch", "--backend", "slurm", "--nodes", "3", "--", "t.py"]) == 1
    assert "--nodes 3, but Slurm job 7 has 2 node(s) (n1, n2)" in capsys.readouterr().err


def test_requeue_makes_the_job_requeueable_appending_and_signalled_before_its_end(
    outside_slurm, capsys
):
    request = sbatch.BatchRequest(nodes=2, time="4:00:00", requeue=True, signal_before_s=300)
    assert request.directives("o")[-3:] == [
        "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@300"
    ]  # fmt: skip
    assert main(["launch", "--backend", "slurm", "--nodes", "2", "--signal-before", "60",
                 "--", "t.py"]) == 1  # fmt: skip
    assert "--signal-before without --requeue: add --requeue" in capsys.readouterr().err


def test_a_rank_under_requeue_keeps_running_on_the_signal_and_flags_it():
    import signal

    from trainfleet.train.preempt import Preemption

    before = signal.getsignal(signal.SIGUSR1)
    try:
        flag = Preemption.listen("USR1")
        os.kill(os.getpid(), signal.SIGUSR1)  # SIGUSR1's default would end this process
        assert flag.got and not flag.agreed
    finally:
        signal.signal(signal.SIGUSR1, before)
