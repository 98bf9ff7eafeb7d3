"""setup/sync CLI pieces: questions, the password, the rendered result, light imports, and
the password's path through ssh (never on a command line, never in a file)."""

from __future__ import annotations

import doctest
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet.cli import setup_cmd
from trainfleet.cli.main import build_parser, main
from trainfleet.cluster import Node
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.errors import SetupError
from trainfleet.setup.result import SetupResult, render
from trainfleet.setup.trust import askpass

pytestmark = pytest.mark.unit

MODULES = [
    "trainfleet.setup.trust.askpass",
    "trainfleet.setup.env",
    "trainfleet.setup.firewall.ruleset",
    "trainfleet.setup.firewall.record",
    "trainfleet.setup.hostfile",
    "trainfleet.setup.trust.hostkeys",
    "trainfleet.setup.trust.keyjobs",
    "trainfleet.setup.trust.this_machine",
    "trainfleet.setup.result",
    "trainfleet.setup.sync.step",
    "trainfleet.setup.sync.transfer",
    "trainfleet.setup.trust.step",
    "trainfleet.setup.verify",
    "trainfleet.sandbox.users",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, name


def test_the_cli_path_stays_light():
    code = (
        "import sys, trainfleet.cli.main, trainfleet.cli.setup_cmd, trainfleet.cli.sync_cmd; "
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("step", ["ssh", "hostfile", "env", "firewall"])
def test_every_step_has_help(step, capsys):
    with pytest.raises(SystemExit) as done:
        main(["setup", step, "--help"])
    assert done.value.code == 0
    assert "--dry-run" in capsys.readouterr().out


def test_a_question_without_terminal_is_a_no_and_says_how_to_say_yes(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    out = io.StringIO()
    assert setup_cmd.make_confirm(False, out)("trust these keys?") is False
    assert "trust these keys?" in out.getvalue() and "pass --yes" in out.getvalue()
    assert setup_cmd.make_confirm(True, io.StringIO())("trust?") is True


def test_yes_never_replaces_a_changed_host_key(monkeypatch):
    """A changed key is the man-in-the-middle case: scripts pass --yes for new keys, and that
    must not also say yes to this one (#17)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    out = io.StringIO()
    assert setup_cmd.make_confirm(True, out)("replace?", changed_keys=True) is False
    assert "--yes does not replace CHANGED host keys" in out.getvalue()
    assert "--replace-changed-host-keys" in out.getvalue()
    explicit = setup_cmd.make_confirm(False, io.StringIO(), replace_changed=True)
    assert explicit("replace?", changed_keys=True) is True
    args = build_parser().parse_args(["setup", "ssh", "--replace-changed-host-keys"])
    assert args.replace_changed_host_keys and not args.yes


def test_the_password_comes_from_stdin_or_a_terminal_only(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\n"))
    assert setup_cmd.make_password(True)(["gpu-node-1"]) == "s3cret"
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(SetupError) as err:
        setup_cmd.make_password(False)(["gpu-node-1", "gpu-node-2"])
    assert "gpu-node-[1-2]" in err.value.what and "--password-stdin" in err.value.fix


def test_render_folds_nodes_and_says_when_nothing_changed():
    result = SetupResult(step="ssh", checks=["ssh"])
    assert render(result).splitlines() == [
        "trainfleet setup ssh: nothing changed",
        "doctor (ssh): no problems found",
    ]
    for host in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
        result.add(host, "created key ~/.ssh/id_ed25519")
    result.findings = [
        Finding(
            id="ssh-auth-failed",
            severity=Severity.WARNING,
            nodes=("gpu-node-2",),
            evidence=["a -> b"],
            fix="f",
        )
    ]
    text = render(result)
    assert "  gpu-node-[1-3]: created key ~/.ssh/id_ed25519" in text
    assert "WARNING ssh-auth-failed  [gpu-node-2]" in text
    assert result.exit_code == 0  # ERROR by default
    result.fail_at = Severity.WARNING
    assert result.exit_code == 1 and result.to_json()["exit_code"] == 1
    dry = SetupResult(step="firewall", dry_run=True)
    dry.add("gpu-node-1", "would add x")
    assert render(dry).startswith("trainfleet setup firewall (dry run): would make 1 change(s)")


def test_the_password_travels_only_in_the_environment_of_the_one_ssh(monkeypatch):
    seen = {}
    real_run = subprocess.run

    def fake_run(argv, *, input, env, **kwargs):
        helper = env["SSH_ASKPASS"]
        seen.update(argv=argv, helper_text=Path(helper).read_text(), env=dict(env))
        seen["answer"] = real_run(
            [helper, "Password:"], env=env, capture_output=True, text=True
        ).stdout
        seen["helper"] = helper
        return subprocess.CompletedProcess(argv, 0, b'{"authorized_added": 1}\n', b"")

    monkeypatch.setattr(askpass.subprocess, "run", fake_run)
    node = Node(host="gpu-node-2", slots=1, gpu_ids=(0,), python="python3")
    [result] = askpass.run_with_password([node], ["python3", "-"], {"gpu-node-2": b"{}"}, "pw1!")
    assert result.ok and seen["answer"] == "pw1!\n"
    assert "pw1!" not in " ".join(seen["argv"]) and "pw1!" not in seen["helper_text"]
    assert seen["env"]["SSH_ASKPASS_REQUIRE"] == "force"
    assert "-oBatchMode=no" in seen["argv"] and "-oStrictHostKeyChecking=yes" in seen["argv"]
    assert not os.path.exists(seen["helper"])  # the helper's private directory is gone
    assert "pw1!" not in os.environ.values()


def test_notes_about_many_nodes_fold():
    from trainfleet.setup.result import fold_notes

    notes = ["gpu-node-1: PATH recorded", "gpu-node-2: PATH recorded", "gpu-node-3: other"]
    assert fold_notes(notes) == ["gpu-node-[1-2]: PATH recorded", "gpu-node-3: other"]


def test_the_password_never_reaches_a_shared_master_or_a_jump_host():
    """#17: a user's ControlMaster/ControlPersist would keep the password in a master for
    minutes; a ProxyJump's ssh would offer it to the jump host."""
    from trainfleet.cluster import SshOptions
    from trainfleet.setup.trust import hostkeys

    node = Node(host="gpu-node-2", slots=1, gpu_ids=(0,), python="python3")
    argv = askpass.password_ssh_argv(node, ["true"])
    assert argv.index("-oControlMaster=no") < argv.index("--")
    assert "-oControlPath=none" in argv
    jumped = Node(host="gpu-node-3", slots=1, gpu_ids=(0,), python="python3",
                  ssh=SshOptions(options=("-o", "ProxyJump=bastion")))  # fmt: skip
    # what setup_ssh checks before it asks for the password (trust._log_in)
    assert hostkeys.target_of(jumped).proxied and not hostkeys.target_of(node).proxied


def test_setup_help_and_the_catalog_follow_the_one_step_table():
    """The step order is setup/steps.py's STEPS: `trainfleet setup --help` lists the steps in
    it (its list had pyenv after hosts, while every step ran it fourth), the subcommands come
    from it, and every `fixed_by` command of the catalog is a step in it (the catalog's own copy
    lacked `setup hosts`)."""
    from trainfleet.catalog import CATALOG
    from trainfleet.setup.every import STEPS as EVERY_RUNS
    from trainfleet.setup.steps import ORDER, STEPS

    assert EVERY_RUNS == ORDER
    listed = [line.split()[0].strip("()") for line in setup_cmd.DESCRIPTION.splitlines()
              if line.startswith("  ") and not line.startswith("   ")]  # fmt: skip
    assert listed == list(ORDER)
    assert setup_cmd.ALONE == ORDER[:-1] and ORDER[-1] == "sync"
    commands = {step.command for step in STEPS}
    for entry in CATALOG.values():
        if entry.fixed_by:
            assert entry.fixed_by.split(" --")[0] in commands, entry.fixed_by
