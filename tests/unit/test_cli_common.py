"""When the preflight doctor stops `launch` or `train`, the user is told which trainfleet command
fixes what it found, with the cluster options they typed (#21)."""

from __future__ import annotations

import pytest

from trainfleet.catalog import CATALOG, commands_that_fix
from trainfleet.cli.common import preflight_lines
from trainfleet.cli.main import build_parser
from trainfleet.doctor.findings import Finding, Severity

pytestmark = pytest.mark.unit


def _finding(finding_id: str, *nodes: str, severity=Severity.ERROR) -> Finding:
    return Finding(id=finding_id, severity=severity, nodes=nodes, evidence=["seen"], fix="fix")


def test_each_command_once_in_the_order_setup_runs_its_steps_with_what_it_fixes():
    found = [
        _finding("firewall-blocks-ports", "gpu-node-1"),
        _finding("remote-env-differs", "gpu-node-2", severity=Severity.WARNING),
        _finding("ssh-auth-failed", "gpu-node-2", "gpu-node-3"),
        _finding("iface-mismatch", "gpu-node-3"),
        _finding("port-in-use", "gpu-node-1"),  # no command fixes it: its fix text says what to do
        _finding("torch-missing", "gpu-node-2"),
    ]
    assert commands_that_fix(found, ["--hostfile", "my hosts"]) == [
        "trainfleet setup ssh --hostfile 'my hosts'   (ssh-auth-failed on gpu-node-[2-3])",
        "trainfleet setup env --hostfile 'my hosts'"
        "   (remote-env-differs on gpu-node-2, iface-mismatch on gpu-node-3)",
        "trainfleet setup pyenv --hostfile 'my hosts'   (torch-missing on gpu-node-2)",
        "trainfleet setup firewall --apply --hostfile 'my hosts'"
        "   (firewall-blocks-ports on gpu-node-1)",
    ]


def test_every_command_named_in_the_catalog_is_one_the_cli_takes():
    parser = build_parser()
    for finding_id, entry in CATALOG.items():
        if entry.fixed_by:
            args = parser.parse_args([*entry.fixed_by.split(), "-c", "cluster.yaml"])
            assert args.cluster_file == "cluster.yaml", finding_id


def test_launch_and_train_print_the_findings_the_commands_and_the_way_around():
    for command in (["launch", "--", "python", "train.py"], ["train", "--model", "m"]):
        args = build_parser().parse_args(
            [*command[:1], "-c", "c.yaml", "-e", "gpu-node-4", *command[1:]]
        )
        text = "\n".join(preflight_lines([_finding("firewall-blocks-ports", "gpu-node-1")], args))
        assert "ERROR" in text and "firewall-blocks-ports" in text
        assert (
            "fix with:\n  trainfleet setup firewall --apply -c c.yaml -e gpu-node-4"
            "   (firewall-blocks-ports on gpu-node-1)\n"
        ) in text
        assert text.endswith("or pass --no-preflight to start anyway")
    # nothing a command fixes: no "fix with" line
    lines = preflight_lines([_finding("port-in-use", "gpu-node-1")], args)
    assert not any(line.startswith("fix with") for line in lines)
