"""The command every rank runs, checked on the launch node before anything starts: launchers
whose flags carry the layout are refused with the command to use instead; LLaMA-Factory's,
axolotl's and TRL's training CLIs run the module their launcher starts, with a note;
`python train.py` runs train.py with each node's python."""

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
        ("/opt/venv/bin/torchrun train.py", ("train.py",)),
    ],
)
def test_a_nested_launcher_is_refused_with_the_command_to_use(command, instead):
    with pytest.raises(NestedLauncher) as refused:
        entry_command(tuple(command.split()), {})
    assert refused.value.instead == instead
    assert "trainfleet launch [cluster options] -- " in refused.value.fix
    assert "--nproc_per_node/--num_gpus" in refused.value.fix  # their flags, mapped


@pytest.mark.parametrize(
    ("command", "what"),
    [
        ("torchrun --nproc_per_node=8 train.py", "torchrun starts its own ranks, and trainfleet"),
        ("deepspeed train.py", "DeepSpeed's runner (`deepspeed`) starts its own ranks, and"),
        ("accelerate launch train.py", "`accelerate launch` starts its own ranks, and trainfleet"),
        ("python -m torch.distributed.run t.py", "python -m torch.distributed.run starts its own"),
    ],
)
def test_a_launcher_refusal_says_only_what_holds_on_any_cluster(command, what):
    """Each launcher starts its own ranks whatever the nodes hold: the refusal names no GPU
    count (llamafactory-cli was refused 'on a node with more than one GPU' on CPU nodes)."""
    with pytest.raises(NestedLauncher) as refused:
        entry_command(tuple(command.split()), {})
    assert refused.value.what.startswith(what)
    assert refused.value.what.endswith(
        "already starts one rank per slot on every node: each rank would start a whole job "
        "(nested-launcher)"
    )
    assert "GPU" not in refused.value.what


@pytest.mark.parametrize(
    ("command", "env", "runs"),
    [
        (
            "llamafactory-cli train examples/train_full/qwen_full_sft.yaml",
            {},
            "-m llamafactory.launcher examples/train_full/qwen_full_sft.yaml",
        ),
        # FORCE_TORCHRUN only makes LLaMA-Factory's own launcher start torchrun: same module.
        (
            "lmf train cfg.yaml lr=1e-5",
            {"FORCE_TORCHRUN": "1"},
            "-m llamafactory.launcher cfg.yaml lr=1e-5",
        ),
        # USE_V1: LLaMA-Factory's v1 launcher, which keeps the command word.
        (
            "llamafactory-cli train cfg.yaml",
            {"USE_V1": "1"},
            "-m llamafactory.v1.launcher train cfg.yaml",
        ),
        ("axolotl train config.yml", {}, "-m axolotl.cli.train config.yml"),
        (
            "axolotl train config.yml --learning-rate=1e-4 --micro-batch-size 2",
            {},
            "-m axolotl.cli.train config.yml --learning-rate=1e-4 --micro-batch-size 2",
        ),
        (
            "trl sft --model_name_or_path m --dataset_name d --output_dir o",
            {},
            "-m trl.scripts.sft --model_name_or_path m --dataset_name d --output_dir o",
        ),
        ("/opt/venv/bin/trl dpo --config dpo.yaml", {}, "-m trl.scripts.dpo --config dpo.yaml"),
    ],
)
def test_a_training_cli_runs_the_module_its_launcher_starts_with_a_note(command, env, runs):
    ran, note = entry_command(tuple(command.split()), env)
    assert ran == tuple(runs.split())
    cli = " ".join(w.rsplit("/", 1)[-1] for w in command.split()[:2])
    assert note.startswith(f"running `{runs}` on every rank: what `{cli}` has ")
    assert note.endswith("start on each rank, with all your arguments")
    assert "\n" not in note


def test_axolotl_launcher_choice_is_dropped_and_said():
    ran, note = entry_command(("axolotl", "train", "c.yml", "--launcher", "torchrun", "--lr=1"), {})
    assert ran == ("-m", "axolotl.cli.train", "c.yml", "--lr=1")
    assert note.endswith("(--launcher dropped: trainfleet is the launcher)")
    ran, _ = entry_command(("axolotl", "train", "c.yml", "--launcher=python"), {})
    assert ran == ("-m", "axolotl.cli.train", "c.yml")


@pytest.mark.parametrize(
    ("command", "what", "instead"),
    [
        (
            "trl sft --model_name_or_path m --num_processes 8 --multi_gpu --output_dir o",
            "--num_processes, --multi_gpu are for `trl sft` itself or the `accelerate launch` it"
            " starts, not for trl.scripts.sft: the ranks would run without them",
            "-m trl.scripts.sft --model_name_or_path m --output_dir o",
        ),
        (
            "trl grpo --accelerate_config=zero3 --model_name_or_path m",
            "--accelerate_config is for `trl grpo` itself or the `accelerate launch` it starts,"
            " not for trl.scripts.grpo: the ranks would run without it",
            "-m trl.scripts.grpo --model_name_or_path m",
        ),
        (
            "axolotl train c.yml --sweep sweep.yml",
            "--sweep is for `axolotl train` itself or the `accelerate launch` it starts, not for"
            " axolotl.cli.train: the ranks would run without it",
            "-m axolotl.cli.train c.yml",
        ),
        (
            "axolotl train c.yml -- --num_processes 8",
            "--num_processes, what follows `--` are for `axolotl train` itself or the"
            " `accelerate launch` it starts, not for axolotl.cli.train: the ranks would run"
            " without them",
            "-m axolotl.cli.train c.yml",
        ),
    ],
)
def test_a_training_cli_given_its_launchers_options_is_refused_naming_them(command, what, instead):
    with pytest.raises(NestedLauncher) as refused:
        entry_command(tuple(command.split()), {})
    assert refused.value.what == f"{what} (nested-launcher)"
    assert refused.value.instead == tuple(instead.split())
    assert f"run `trainfleet launch [cluster options] -- {instead}`" in refused.value.fix
    # What the dropped options carried has a place to go: the fix says where.
    assert refused.value.fix.endswith(
        "goes in the module's own arguments or config (DeepSpeed's: --deepspeed ds.json, or the "
        "YAML's `deepspeed:`), a sweep is one launch per config"
    )


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
