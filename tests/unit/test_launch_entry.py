"""The command every rank runs, checked on the launch node before anything starts: launchers
inside it are refused with the command to use instead; `python train.py` runs train.py with
each node's python."""

from __future__ import annotations

import pytest

from trainfleet.launch.entry import NestedLauncher, entry_command

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("command", "instead"),
    [
        (
            "torchrun --nnodes 2 --nproc_per_node=8 train.py --deepspeed ds.json",
            ("train.py", "--deepspeed", "ds.json"),
        ),
        (
            "python -m torch.distributed.run --nproc_per_node 2 -m pkg.train --x",
            ("-m", "pkg.train", "--x"),
        ),
        ("-m torch.distributed.launch train.py", ("train.py",)),
        (
            "deepspeed --hostfile hostfile --master_port 29501 train.py --deepspeed ds.json",
            ("train.py", "--deepspeed", "ds.json"),
        ),
        (
            "accelerate launch --config_file acc.yaml --num_processes 8 train.py --lr 1e-4",
            ("train.py", "--lr", "1e-4"),
        ),
        (
            "llamafactory-cli train examples/train_full/qwen_full_sft.yaml",
            ("-m", "llamafactory.launcher", "examples/train_full/qwen_full_sft.yaml"),
        ),
        ("lmf train cfg.yaml lr=1e-5", ("-m", "llamafactory.launcher", "cfg.yaml", "lr=1e-5")),
        ("axolotl train config.yml", ("-m", "axolotl.cli.train", "config.yml")),
        ("trl sft --model_name_or_path m", ("-m", "trl.scripts.sft", "--model_name_or_path", "m")),
        ("/opt/venv/bin/torchrun train.py", ("train.py",)),
    ],
)
def test_a_nested_launcher_is_refused_with_the_command_to_use(command, instead):
    with pytest.raises(NestedLauncher) as refused:
        entry_command(tuple(command.split()), {})
    assert refused.value.instead == instead
    assert "trainfleet launch [cluster options] -- " in refused.value.fix
    assert "--nproc_per_node/--num_gpus" in refused.value.fix  # their flags, mapped


def test_llamafactory_names_force_torchrun_when_it_is_set():
    with pytest.raises(NestedLauncher, match="FORCE_TORCHRUN is set"):
        entry_command(("llamafactory-cli", "train", "cfg.yaml"), {"FORCE_TORCHRUN": "1"})


@pytest.mark.parametrize(
    "command",
    [
        "train.py --lr 1e-4",
        "-m pkg.train",
        "./run_finetune.sh --epochs 1",
        "llamafactory-cli export cfg.yaml",  # not training: no torchrun of its own
        "axolotl preprocess config.yml",
        "my-deepspeed-job.py",
        "accelerate-config-helper",
        "trl env",
    ],
)
def test_ordinary_commands_run_as_they_are(command):
    words = tuple(command.split())
    assert entry_command(words, {}) == (words, None)


def test_python_in_front_runs_the_script_with_each_nodes_python_and_says_so():
    command, note = entry_command(("python3", "train.py", "--lr", "1"), {})
    assert command == ("train.py", "--lr", "1") and "drop `python3`" in note
    command, _ = entry_command(("/usr/bin/python3.11", "-m", "pkg.train"), {})
    assert command == ("-m", "pkg.train")
