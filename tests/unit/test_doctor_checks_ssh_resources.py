"""Doctor ssh and resource checks on recorded fact sheets."""

from __future__ import annotations

import pytest
from doctor_fixtures import expect_one, make_survey, reparsed, sheets_of, window, with_id

from trainfleet.doctor.checks import resources, ssh
from trainfleet.doctor.findings import Severity, merge
from trainfleet.doctor.pace import ProbeTimes
from trainfleet.remote import NodeResult, classify

pytestmark = pytest.mark.unit

N1, N2, N3 = "gpu-node-1", "gpu-node-2", "gpu-node-3"
GIB = 1 << 30


@pytest.fixture
def survey(tmp_path):
    return make_survey(tmp_path)


def _ssh_failed(node: str, stderr: str, returncode: int | None = 255) -> NodeResult:
    timed_out = returncode is None
    return NodeResult(
        node=node,
        returncode=returncode,
        stdout="",
        stderr=stderr,
        duration_s=30.0 if timed_out else 0.4,
        failure=classify(returncode, stderr, timed_out, True),
    )


# ----------------------------------------------------------------------------- ssh


@pytest.mark.parametrize(
    ("stderr", "pitfall_id", "fix"),
    [
        ("root@gpu-node-2: Permission denied (publickey).", "ssh-auth-failed", "ssh-copy-id"),
        ("ssh: connect to host 10.0.0.2 port 22: Connection refused", "ssh-unreachable", "sshd"),
        ("ssh: connect to host 10.0.0.2 port 22: Connection timed out", "ssh-unreachable", "22"),
        (
            "ssh: Could not resolve hostname gpu-node-2: Name or service not known",
            "hostname-unresolvable",
            "/etc/hosts",
        ),  # fmt: skip
        ("Host key verification failed.", "ssh-hostkey-unknown", "ssh-keyscan"),
        (
            "@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @\nHost key verification failed.",
            "ssh-hostkey-changed",
            "ssh-keygen -R",
        ),  # fmt: skip
        (
            "Unable to negotiate with 10.0.0.2 port 22: no matching host key type found. "
            "Their offer: ssh-rsa",
            "ssh-hostkey-algo",
            "HostKeyAlgorithms",
        ),  # fmt: skip
    ],
)
def test_ssh_from_the_launch_node(tmp_path, stderr, pitfall_id, fix):
    survey = make_survey(tmp_path, failed={N2: _ssh_failed(N2, stderr)})
    last_line = stderr.splitlines()[-1]
    expect_one(
        ssh.check_launch_ssh(survey),
        pitfall_id,
        Severity.ERROR,
        (N2,),
        evidence=["ssh from this machine", last_line],
        fix=[fix, N2],
        nodes_in_evidence=N2 in last_line,
    )


def test_probe_that_did_not_finish_without_times_is_slow_node_not_unreachable(tmp_path):
    survey = make_survey(tmp_path, failed={N3: _ssh_failed(N3, "", returncode=None)})
    expect_one(
        ssh.check_launch_ssh(survey),
        "slow-node",
        Severity.ERROR,
        (N3,),
        evidence=["did not finish in 30 s"],
        fix=[N3, "time ssh"],
        nodes_in_evidence=False,
    )


@pytest.mark.parametrize(
    ("times", "evidence"),
    [
        (ProbeTimes(bound="start"), ["ssh did not fail", "had not started after 30 s",
                                      "other nodes' started in 1.5 s"]),
        (ProbeTimes(started_s=2.0, phase="peers", bound="silence"),
         ["started after 2.0 s", "said nothing for 45 s (peers)"]),
        (ProbeTimes(started_s=2.0, phase="facts", bound="cap"),
         ["still working (facts) 30 s after ssh began", "3x"]),
    ],
)  # fmt: skip
def test_a_probe_stopped_by_its_pace_says_why(tmp_path, times, evidence):
    """What `Pace` saw of the probe decides the words: never ssh-unreachable, ssh did not fail."""
    survey = make_survey(tmp_path, failed={N3: _ssh_failed(N3, "", returncode=None)})
    survey.times = {N1: ProbeTimes(started_s=1.0), N2: ProbeTimes(started_s=2.0), N3: times}
    expect_one(ssh.check_launch_ssh(survey), "slow-node", Severity.ERROR, (N3,),
               evidence=evidence, fix=[N3], nodes_in_evidence=False)  # fmt: skip


def test_a_probe_that_started_or_worked_far_later_than_the_others_is_a_warning(survey):
    survey.times = {N1: ProbeTimes(started_s=0.5), N2: ProbeTimes(started_s=0.7),
                    N3: ProbeTimes(started_s=12.6)}  # fmt: skip
    expect_one(ssh.check_slow_nodes(survey), "slow-node", Severity.WARNING, (N3,),
               evidence=["started after 12.6 s", "median: 0.6 s"], fix=[N3])  # fmt: skip
    # its own work: the seconds of its sheet, but for the wait at the barrier
    sheets = sheets_of(survey)
    for host, seconds in ((N1, 2.0), (N2, 2.5), (N3, 30.0)):
        sheets[host]["seconds"], sheets[host]["active"]["go_wait"] = seconds, 1.0
    survey.times = {h: ProbeTimes(started_s=1.0) for h in (N1, N2, N3)}
    work = ["did its own work in 29.0 s", "median: 1.2 s"]
    expect_one(ssh.check_slow_nodes(reparsed(survey, sheets)), "slow-node", Severity.WARNING,
               (N3,), evidence=work, fix=[N3])  # fmt: skip


def test_probes_all_slow_alike_or_under_the_floor_are_not_named(survey):
    """A busy launch machine slows every probe alike: no node is named for it; nor is a node
    a few seconds behind."""
    survey.times = {N1: ProbeTimes(started_s=20.0), N2: ProbeTimes(started_s=30.0),
                    N3: ProbeTimes(started_s=40.0)}  # fmt: skip
    assert ssh.check_slow_nodes(survey) == []
    survey.times = {N1: ProbeTimes(started_s=0.2), N2: ProbeTimes(started_s=0.3),
                    N3: ProbeTimes(started_s=4.5)}  # fmt: skip
    assert ssh.check_slow_nodes(survey) == []


def _node_ssh(sheets, src, dst, rc, stderr):
    sheets[src]["active"]["ssh"][dst] = {"rc": rc, "stderr": stderr, "seconds": 0.3}


def test_node_to_node_ssh_denied_is_a_warning_on_the_destination(survey):
    sheets = sheets_of(survey)
    _node_ssh(sheets, N1, N3, 255, "root@gpu-node-3: Permission denied (publickey).")
    _node_ssh(sheets, N2, N3, 255, "root@gpu-node-3: Permission denied (publickey).")
    survey = reparsed(survey, sheets)
    finding = expect_one(
        merge(ssh.check_node_to_node_ssh(survey)),  # as run_checks does
        "ssh-auth-failed",
        Severity.WARNING,
        (N3,),
        evidence=[f"{N1} -> {N3}: root@gpu-node-3: Permission denied", f"{N2} -> {N3}"],
        fix=[f"ssh-copy-id {N3}", "pdsh"],
    )
    assert len(finding.evidence) == 2


def test_node_to_itself(survey):
    sheets = sheets_of(survey)
    _node_ssh(sheets, N1, N1, 255, "Host key verification failed.")
    survey = reparsed(survey, sheets)
    expect_one(
        ssh.check_node_to_node_ssh(survey),
        "ssh-hostkey-unknown",
        Severity.WARNING,
        (N1,),
        evidence=[f"{N1} -> {N1}"],
    )


def test_node_to_node_not_repeated_for_a_node_already_failed(tmp_path):
    denied = "root@gpu-node-3: Permission denied (publickey)."
    survey = make_survey(tmp_path, failed={N3: _ssh_failed(N3, denied)})
    sheets = sheets_of(survey)
    _node_ssh(sheets, N2, N3, 255, denied)
    survey = reparsed(survey, sheets)
    assert ssh.check_node_to_node_ssh(survey) == []
    expect_one(ssh.check_launch_ssh(survey), "ssh-auth-failed", Severity.ERROR, (N3,))


def test_node_to_node_ssh_timeout_is_unreachable_not_auth(survey):
    sheets = sheets_of(survey)
    _node_ssh(sheets, N2, N3, 124, "timed out after 8 s")
    survey = reparsed(survey, sheets)
    expect_one(ssh.check_node_to_node_ssh(survey), "ssh-unreachable", Severity.WARNING, (N3,))


def test_ssh_silent_on_the_recording(survey):
    assert ssh.check_launch_ssh(survey) == [] and ssh.check_node_to_node_ssh(survey) == []


# ----------------------------------------------------------------------------- resources


def test_shared_storage_missing(survey):
    sheets = sheets_of(survey)
    for facts in sheets.values():
        facts["active"]["shared"] = dict.fromkeys(facts["active"]["shared"], False)
    survey = reparsed(survey, sheets)
    finding = expect_one(
        resources.check_shared_storage(survey),
        "shared-dir-missing",
        Severity.INFO,
        (N1, N2, N3),
        evidence=[f"{N1} does not see {N2}'s file"],
        fix=["copied to every node"],
    )
    assert len(finding.evidence) == 6


def test_shared_storage_ignores_nodes_that_wrote_no_token(survey):
    sheets = sheets_of(survey)
    sheets[N3]["active"]["token"] = "not written: Read-only file system"
    sheets[N1]["active"]["shared"][N3] = False
    sheets[N2]["active"]["shared"][N3] = False
    assert resources.check_shared_storage(reparsed(survey, sheets)) == []
    sheets[N1]["active"]["shared"][N2] = False
    finding = expect_one(
        resources.check_shared_storage(reparsed(survey, sheets)),
        "shared-dir-missing",
        Severity.INFO,
        (N1, N2, N3),
        nodes_in_evidence=False,
    )
    assert finding.evidence == [f"{N1} does not see {N2}'s file in the working directory"]


def test_small_shm(survey):
    sheets = sheets_of(survey)
    sheets[N2]["shm"] = {"total": 64 << 20, "free": 64 << 20}
    survey = reparsed(survey, sheets)
    expect_one(
        resources.check_shm(survey),
        "shm-small",
        Severity.WARNING,
        (N2,),
        evidence=["0.06 GiB"],
        fix=["--shm-size"],
    )


def test_low_disk(survey):
    sheets = sheets_of(survey)
    sheets[N3]["workdir"]["disk"]["free"] = 5 * GIB
    survey = reparsed(survey, sheets)
    expect_one(
        resources.check_disk(survey),
        "disk-low",
        Severity.WARNING,
        (N3,),
        evidence=["5.0 GiB", "/tmp"],
    )


def test_infiniband_with_limited_memlock(survey):
    sheets = sheets_of(survey)
    sheets[N1]["infiniband"] = {"mlx5_0": {"1": {"state": "4: ACTIVE", "link_layer": "IB"}}}
    expect_one(
        resources.check_memlock(reparsed(survey, sheets)),
        "ib-memlock",
        Severity.ERROR,
        (N1,),
        evidence=["8388608"],
        fix=["memlock"],
    )
    sheets[N1]["limits"]["memlock"] = None  # unlimited
    assert resources.check_memlock(reparsed(survey, sheets)) == []


def test_fewer_gpus_than_slots(tmp_path):
    survey = make_survey(tmp_path, slots={N2: 2})
    sheets = sheets_of(survey)
    sheets[N2]["gpus"] = {"devices": [{"index": "0", "name": "H100"}], "processes": []}
    survey = reparsed(survey, sheets)
    expect_one(
        resources.check_gpus(survey),
        "gpu-count-mismatch",
        Severity.ERROR,
        (N2,),
        evidence=["1 GPU(s) but slots=2"],
        fix=["slots=1", N2],
    )


def test_gpus_held_by_leftover_processes(survey):
    sheets = sheets_of(survey)
    process = {"pid": "4242", "process_name": "python", "used_memory": "10240", "gpu_uuid": "GPU-1"}
    sheets[N3]["gpus"] = {"devices": [{"index": "0", "name": "H100"}], "processes": [process]}
    survey = reparsed(survey, sheets)
    expect_one(
        resources.check_gpus(survey),
        "gpu-busy",
        Severity.WARNING,
        (N3,),
        evidence=["pid 4242 python uses 10240 MiB"],
        fix=["kill", N3],
    )


def test_clock_skew(survey):
    sheets = sheets_of(survey)
    started, finished = window()
    sheets[N2]["time"] += 10.0
    skew = sheets[N2]["time"] - finished
    survey = reparsed(survey, sheets)
    expect_one(
        resources.check_clocks(survey, started, finished),
        "clock-skew",
        Severity.WARNING,
        (N2,),
        evidence=[f"{skew:.1f} s off"],
        fix=["NTP"],
    )


def test_resources_silent_on_the_recording(survey):
    started, finished = window()
    assert resources.check_clocks(survey, started, finished) == []
    for check in (
        resources.check_gpus,
        resources.check_shm,
        resources.check_disk,
        resources.check_memlock,
    ):
        assert check(survey) == []
    assert with_id(resources.check_shared_storage(survey), "shared-dir-missing") == []
