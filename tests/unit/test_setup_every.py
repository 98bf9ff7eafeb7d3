"""`trainfleet setup` with no step: the order, the stops and the skips, with each step replaced
by a stand-in (the real steps run against sandboxes in tests/cluster/test_setup.py)."""

from __future__ import annotations

import pytest

from trainfleet.cluster import load_cluster
from trainfleet.errors import SetupError
from trainfleet.setup import every
from trainfleet.setup.result import SetupResult

pytestmark = pytest.mark.unit


class Steps:
    """Stand-ins: each step records the cluster file it was given; `fail` picks how one ends."""

    def __init__(self, fail: dict[str, str] | None = None, changed_keys: tuple[str, ...] = ()):
        self.fail = fail or {}
        self.changed_keys = changed_keys
        self.ran: list[tuple[str, str | None]] = []
        self.answers: dict[str, bool] = {}

    def __call__(self, step, cluster, cluster_file, *, dry_run=False, confirm=None):
        self.ran.append((step, cluster_file))
        if self.fail.get(step) == "raise" or (dry_run and self.fail.get(step) == "unseen"):
            raise SetupError(f"{step} cannot reach gpu-node-2", "fix ssh first")
        if confirm is not None and not dry_run:
            changed = step in self.changed_keys
            self.answers[step] = confirm(f"{step}: go ahead?", changed_keys=changed)
        result = SetupResult(step=step, dry_run=dry_run)
        if step == "hostfile":
            result.files["cluster"] = "written.yaml"
        if self.fail.get(step) == "finding":
            from trainfleet.doctor.findings import Finding, Severity

            result.findings = [Finding(id="ssh-auth-failed", severity=Severity.ERROR,
                                       nodes=("gpu-node-2",), evidence=[], fix="")]  # fmt: skip
        else:
            result.add("gpu-node-1", f"{step} done")
        return result


def NONE(step):  # no questions: a stand-in asks none without a confirm
    return None


@pytest.fixture
def doctor_runs(monkeypatch):
    runs = []

    def fake_doctor(cluster):
        from trainfleet.doctor import DoctorReport

        runs.append(cluster)
        return DoctorReport(findings=[], nodes={})

    monkeypatch.setattr(every, "run_doctor", fake_doctor)
    return runs


def _load(path):
    return load_cluster(hosts="gpu-node-1,gpu-node-2")


def test_every_step_in_order_each_reading_the_cluster_file_the_hostfile_step_wrote(doctor_runs):
    steps = Steps()
    run = every.setup_every(_load, cluster_file="given.yaml", confirm=NONE, run_step=steps,
                            code_dir="/code")  # fmt: skip
    assert steps.ran == [("ssh", "given.yaml"), ("hostfile", "given.yaml"),
                         ("env", "written.yaml"), ("pyenv", "written.yaml"),
                         ("firewall", "written.yaml"), ("hosts", "written.yaml"),
                         ("sync", "written.yaml")]  # fmt: skip
    assert run.exit_code == 0 and run.changed and len(doctor_runs) == 1
    seconds = [step["seconds"] for step in run.to_json()["steps"]]
    assert len(seconds) == 7 and all(isinstance(s, float) and s >= 0 for s in seconds)
    text = every.render(run)
    assert "doctor (full, 0.0 s): no problems found" in text
    assert text.endswith("trainfleet setup: changes made")


def test_sync_only_for_a_code_directory_the_user_named(doctor_runs):
    steps = Steps()
    run = every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps,
                            code_dir=None)  # fmt: skip
    assert [s for s, _ in steps.ran] == ["ssh", "hostfile", "env", "pyenv", "firewall", "hosts"]
    assert "--code DIR" in run.skipped["sync"] and run.exit_code == 0


def test_pyenv_only_with_an_environment_path(doctor_runs, monkeypatch):
    """trainfleet outside a venv (system python, conda base) has no path to give the nodes:
    the step is skipped, saying how to name one; --venv PATH runs it."""
    monkeypatch.setattr(every, "default_target", lambda: None)
    steps = Steps()
    run = every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps,
                            code_dir=None)  # fmt: skip
    assert "pyenv" not in [s for s, _ in steps.ran] and "--venv PATH" in run.skipped["pyenv"]
    steps = Steps()
    every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps, code_dir=None,
                      venv="/opt/envs/train")  # fmt: skip
    assert "pyenv" in [s for s, _ in steps.ran]


@pytest.mark.parametrize("how", ["raise", "finding"])
def test_a_failing_step_stops_the_run_there_and_no_doctor_runs(doctor_runs, how):
    steps = Steps(fail={"hostfile": how})
    run = every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps,
                            code_dir="/code")  # fmt: skip
    assert [s for s, _ in steps.ran] == ["ssh", "hostfile"]
    assert run.exit_code == 1 and doctor_runs == []
    text = every.render(run)
    if how == "raise":
        assert run.to_json()["stopped"] == {
            "step": "hostfile", "error": "hostfile cannot reach gpu-node-2", "fix": "fix ssh first"
        }  # fmt: skip
        assert "stopped there" in text
    else:
        assert "stopped after `setup hostfile`" in text


def test_a_dry_run_goes_past_a_step_that_cannot_look_yet_and_changes_nothing(doctor_runs):
    steps = Steps(fail={"hostfile": "raise", "env": "raise"})
    run = every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps,
                            code_dir=None, dry_run=True)  # fmt: skip
    assert [s for s, _ in steps.ran] == ["ssh", "hostfile", "env", "pyenv", "firewall", "hosts"]
    assert run.skipped["hostfile"].startswith("cannot look yet: hostfile cannot reach")
    assert run.exit_code == 0 and not run.changed and doctor_runs == []
    assert every.render(run).endswith("trainfleet setup (dry run): nothing was changed")
    # ...but a dry run that cannot even look at ssh stops: nothing after it could be shown
    steps = Steps(fail={"ssh": "raise"})
    run = every.setup_every(_load, cluster_file=None, confirm=NONE, run_step=steps,
                            code_dir=None, dry_run=True)  # fmt: skip
    assert run.stopped[0] == "ssh" and run.exit_code == 1


def test_with_no_step_and_no_nodes_named_nothing_runs(capsys):
    """`trainfleet setup` alone would set up "this machine alone" and write a hostfile and a
    cluster.yaml into the current directory: refused, saying how to name the nodes."""
    from trainfleet.cli.main import main

    assert main(["setup", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "no nodes were named" in err and "trainfleet setup -c cluster.yaml" in err


def test_options_given_before_a_step_are_kept():
    from trainfleet.cli.main import build_parser

    args = build_parser().parse_args(["setup", "-c", "x.yaml", "--yes", "ssh"])
    assert (args.step, args.cluster_file, args.yes) == ("ssh", "x.yaml", True)
    args = build_parser().parse_args(["setup", "--out", "h", "hostfile"])
    assert args.out == "h"


def test_setup_hostfile_alone_and_in_every_step_write_the_same_hostfile():
    """`setup hostfile` wrote ./hostfile where `trainfleet setup` wrote it next to -c: both
    take their options through setup/steps.py now (cli/setup_cmd.step_options), one rule."""
    from trainfleet.cli import setup_cmd
    from trainfleet.cli.main import build_parser
    from trainfleet.setup.steps import hostfile_out

    for argv in (["setup", "hostfile", "-c", "conf/c.yaml"], ["setup", "-c", "conf/c.yaml"]):
        options = setup_cmd.step_options(build_parser().parse_args(argv))
        assert hostfile_out(options, "conf/c.yaml") == "conf/hostfile", argv
        assert hostfile_out(options, None) == "hostfile"
    given = setup_cmd.step_options(build_parser().parse_args(["setup", "hostfile", "--out", "h"]))
    assert hostfile_out(given, "conf/c.yaml") == "h"


def test_each_step_alone_gets_its_own_flags_and_every_step_the_setup_defaults():
    from trainfleet.cli import setup_cmd
    from trainfleet.cli.main import build_parser

    def options(*argv):
        return setup_cmd.step_options(build_parser().parse_args(["setup", *argv]))

    assert options().firewall_mode == "apply" and not options().revert
    assert options("firewall").firewall_mode == "print"
    assert options("firewall", "--revert").firewall_mode == "revert"
    assert options("firewall", "--revert").revert is False  # hosts' flag, not firewall's
    assert options("hosts", "--revert").revert is True
    assert options("hosts", "--state", "s.json").state_file == "s.json"
    assert options("pyenv", "--package", "x").packages == ["x"]
    assert options("env", "--cluster-out", "o.yaml").cluster_out == "o.yaml"
    assert options("--code", "src").code_dir == "src"


def test_without_yes_every_change_is_listed_first_and_asked_once(doctor_runs):
    """The dry run of every step makes the list; one yes covers the steps in it. A step that
    could not look before the others' changes (here: pyenv) asks on its own when it comes, so
    does ssh (new host keys are trusted on the question that shows their fingerprints), and a
    CHANGED host key is never covered by the one yes."""
    questions = []

    def confirm(question, changed_keys=False):
        questions.append((question, changed_keys))
        return True

    steps = Steps(fail={"pyenv": "unseen"})
    run = every.setup_asking_once(_load, cluster_file=None, confirm=confirm, run_step=steps,
                                  code_dir="/code")  # fmt: skip
    first, _ = questions[0]
    assert first.startswith("trainfleet setup will make these changes:")
    assert "  ssh: gpu-node-1: ssh done" in first and "  sync: gpu-node-1: sync done" in first
    assert "  pyenv: cannot look before the steps above" in first
    # the ones not in the list, and ssh's (the host keys' fingerprints are in its question)
    assert [q for q, _ in questions[1:]] == ["ssh: go ahead?", "pyenv: go ahead?"]
    assert all(steps.answers.values()) and run.exit_code == 0 and len(doctor_runs) == 1

    questions.clear()
    steps = Steps(changed_keys=("ssh",))  # a node's host key CHANGED
    every.setup_asking_once(_load, cluster_file=None, confirm=confirm, run_step=steps,
                            code_dir=None)  # fmt: skip
    assert [q for q, changed in questions if changed] == ["ssh: go ahead?"]


def test_a_no_to_the_one_question_changes_nothing(doctor_runs):
    steps = Steps()
    run = every.setup_asking_once(_load, cluster_file=None, run_step=steps, code_dir=None,
                                  confirm=lambda q, changed_keys=False: False)  # fmt: skip
    assert run.dry_run and not run.changed and run.exit_code == 1 and doctor_runs == []
    assert run.to_json()["stopped"]["error"] == "not confirmed; nothing was changed"


@pytest.mark.parametrize(
    ("step", "module", "function", "expected"),
    [
        ("hostfile", "hostfile", "setup_hostfile",
         {"hostfile_out": "conf/hostfile", "cluster_in": "conf/c.yaml", "cpu_slots": 2}),
        ("env", "env", "setup_env", {"cluster_in": "conf/c.yaml", "cluster_out": None}),
        ("firewall", "firewall.apply", "setup_firewall", {"mode": "apply", "state_file": None}),
        ("hosts", "etchosts", "setup_hosts", {"revert": False, "cluster_in": "conf/c.yaml"}),
    ],
)  # fmt: skip
def test_the_step_table_runs_each_step_with_the_options_given(
    monkeypatch, step, module, function, expected
):
    import importlib

    from trainfleet.setup.steps import StepOptions, step_runner

    seen = {}
    target = importlib.import_module(f"trainfleet.setup.{module}")
    monkeypatch.setattr(target, function, lambda cluster, **kwargs: seen.update(kwargs))
    run_step = step_runner(StepOptions(cpu_slots=2))
    run_step(step, load_cluster(hosts="a:1"), "conf/c.yaml", dry_run=True, confirm=None)
    assert {key: seen[key] for key in expected} == expected and seen["dry_run"] is True


def test_the_step_table_says_what_is_missing_where_the_options_lack_it():
    """A caller of the table that gives no password, or no code directory where cluster.yaml
    names no workdir, gets a SetupError that names it (was a TypeError from deep inside)."""
    from trainfleet.setup.steps import BY_NAME, StepOptions

    with pytest.raises(SetupError) as asked:
        StepOptions().password(["gpu-node-1", "gpu-node-2"])
    assert "gpu-node-[1-2]" in asked.value.what and "--password-stdin" in asked.value.fix
    with pytest.raises(SetupError) as synced:
        BY_NAME["sync"].run(load_cluster(hosts="a:1"), StepOptions(), cluster_file=None,
                            dry_run=True, confirm=lambda *_, **__: True)  # fmt: skip
    assert "no code directory" in synced.value.what and "--code" in synced.value.fix
