"""`trainfleet` called in-process: output, exit codes, error format, light imports."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec

import pytest

from trainfleet.cli.main import main

pytestmark = pytest.mark.unit


def test_exec_echo_on_the_local_cluster(capsys):
    assert main(["exec", "--", "echo", "hi"]) == 0
    out, err = capsys.readouterr()
    assert out == "localhost: hi\n"
    assert err == ""


def test_exec_returns_the_command_exit_code(capsys):
    assert main(["exec", "--", "sh", "-c", "exit 3"]) == 3
    err = capsys.readouterr().err
    assert "1 of 1 nodes failed" in err and "localhost: exit 3" in err


def test_exec_one_word_is_a_shell_line(capsys):
    assert main(["exec", "--", "echo a | tr a b"]) == 0
    assert capsys.readouterr().out == "localhost: b\n"


def test_exec_several_words_are_never_resplit(capsys):
    assert main(["exec", "--", "printf", "%s|", "a b", "$(id)"]) == 0
    assert capsys.readouterr().out == "localhost: a b|$(id)|\n"


def test_exec_json(capsys):
    assert main(["exec", "--json", "--", "echo", "hi"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == ["echo", "hi"]
    (node,) = doc["nodes"]
    assert node["node"] == "localhost"
    assert (node["returncode"], node["failure"], node["stdout"]) == (0, "none", "hi\n")
    assert node["pitfall_id"] is None


def test_exec_json_reports_failure(capsys):
    assert main(["exec", "--json", "--", "sh", "-c", "echo oops >&2; exit 2"]) == 2
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert (node["returncode"], node["failure"], node["stderr"]) == (2, "command_failed", "oops\n")


def test_exec_fold(capsys):
    assert main(["exec", "--fold", "--hosts", "localhost", "--", "echo", "x"]) == 0
    assert capsys.readouterr().out == "localhost: x\n"


def test_exec_fold_groups_equal_output(capsys):
    assert main(["exec", "--fold", "--hosts", "localhost,127.0.0.1", "--", "echo", "x"]) == 0
    assert capsys.readouterr().out == "localhost,127.0.0.1: x\n"


def test_exec_fold_keeps_equal_stdout_together_when_stderr_differs(capsys):
    # Each process writes its own pid to stderr: stdout is the same, stderr differs.
    argv = [
        "exec",
        "--fold",
        "--hosts",
        "localhost,127.0.0.1",
        "--",
        "sh",
        "-c",
        "echo x; echo $$ >&2",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "localhost,127.0.0.1: x\n"
    assert [line.split(":")[0] for line in err.splitlines()] == ["localhost", "127.0.0.1"]


def test_exec_timeout_exit_code(capsys):
    assert main(["exec", "--timeout", "0.3", "--", "sleep", "10"]) == 124
    assert "timed out" in capsys.readouterr().err


def test_exec_include_filters_nodes(capsys):
    hosts = ["--json", "--hosts", "localhost,127.0.0.1"]
    assert main(["exec", *hosts, "-i", "127.0.0.1", "--", "true"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["node"] for n in doc["nodes"]] == ["127.0.0.1"]
    assert (
        main(["exec", "--json", "--hosts", "localhost,127.0.0.1", "-e", "localhost", "--", "true"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [n["node"] for n in doc["nodes"]] == ["127.0.0.1"]


def test_bad_hostfile_path_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "missing-hostfile"
    assert main(["exec", "--hostfile", str(path), "--", "echo", "x"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("trainfleet: ")
    assert str(path) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_hostfile_content_names_the_line(capsys, tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("a slots=1\nb slots=0\n")
    assert main(["exec", "--hostfile", str(path), "--", "true"]) == 1
    assert capsys.readouterr().err.startswith(f"trainfleet: {path}:2: slots for ")


def test_exec_without_a_command(capsys):
    assert main(["exec", "--"]) == 1
    assert capsys.readouterr().err.startswith("trainfleet: no command given")


@pytest.mark.parametrize("command", ["exec", "sandbox"])
def test_help_exits_zero(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: trainfleet {command}")


def test_exec_help_shows_the_cluster_yaml_example(capsys):
    with pytest.raises(SystemExit):
        main(["exec", "--help"])
    out = capsys.readouterr().out
    assert "cluster.yaml example" in out and "--hostfile" in out and "--include" in out


def test_unknown_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2


HEAVY = ("torch", "deepspeed", "transformers", "trainfleet.train")  # the training code too


@pytest.mark.skipif(find_spec("torch") is None, reason="torch is not installed: nothing to catch")
def test_cli_import_leaves_torch_deepspeed_transformers_out():
    code = (
        "import sys, trainfleet.cli.main as m\n"
        "m.build_parser()\n"
        f"heavy = [name for name in {HEAVY!r} if name in sys.modules]\n"
        "assert not heavy, f'imported by the CLI: {heavy}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_deepspeed_runner_flags_parse_with_their_spellings():
    """What users type from DeepSpeed's runner habit: underscores, and the hyphen forms."""
    from trainfleet.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(
        ["launch", "--hosts", "a:4,b:4", "--num_nodes", "1", "--num_gpus", "2",
         "--master_port", "29510", "--master_addr", "10.0.0.5", "--no_python", "--", "run.sh"]
    )  # fmt: skip
    assert (args.num_nodes, args.num_gpus, args.master_port) == (1, 2, 29510)
    assert args.master_addr == "10.0.0.5" and args.no_python
    args = parser.parse_args(["doctor", "--num-nodes", "2", "--num-gpus", "8"])
    assert (args.num_nodes, args.num_gpus) == (2, 8)


def test_num_gpus_with_an_include_fails_as_deepspeed_does(capsys):
    code = main(["exec", "--hosts", "localhost:2", "--num_gpus", "1", "-i", "localhost", "--",
                 "true"])  # fmt: skip
    assert code == 1
    assert "cannot be combined with --include/--exclude" in capsys.readouterr().err


def test_launch_refuses_a_nested_launcher_before_starting_anything(capsys, tmp_path):
    nested = ["accelerate", "launch", "--num_processes", "8", "train.py", "--lr", "1"]
    code = main(["launch", "--run-dir", str(tmp_path / "run"), "--dry-run", "--", *nested])
    err = capsys.readouterr().err
    assert code == 1 and "trainfleet launch [cluster options] -- train.py --lr 1" in err
    assert not (tmp_path / "run").exists()


def test_launch_runs_llamafactory_clis_module_on_every_rank_and_says_so(capsys, monkeypatch):
    """`-- llamafactory-cli train x.yaml` loses nothing as `-m llamafactory.launcher x.yaml`:
    the command every rank runs, and one line that says so (not a refusal)."""
    from trainfleet.cli import launch_cmd
    from trainfleet.cli.main import build_parser

    monkeypatch.delenv("USE_V1", raising=False)
    args = build_parser().parse_args(["launch", "--", "llamafactory-cli", "train", "x.yaml"])
    assert launch_cmd._command(args) == ("-m", "llamafactory.launcher", "x.yaml")
    err = capsys.readouterr().err
    assert err == (
        "trainfleet: running `-m llamafactory.launcher x.yaml` on every rank: what "
        "`llamafactory-cli train` has torchrun start on each rank, with all your arguments\n"
    )


def test_launch_and_train_have_one_hang_timeout_default():
    """launch's watchdog was off unless asked, train's at 300 s: one default now."""
    from trainfleet.cli.main import build_parser
    from trainfleet.heartbeat import HANG_TIMEOUT_S

    parser = build_parser()
    launch = parser.parse_args(["launch", "--", "t.py"])
    train = parser.parse_args(["train", "--model", "m", "--data", "d", "--output", "o"])
    assert launch.hang_timeout == train.hang_timeout == HANG_TIMEOUT_S == 300.0
