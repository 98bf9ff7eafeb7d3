"""`trainfleet train` speaks HF: TrainingArguments names, epochs, a user's DeepSpeed JSON checked
on the launch node, and TrainingArguments built without deprecation warnings."""

from __future__ import annotations

import json
import types
import warnings

import pytest

from trainfleet.cli.main import build_parser
from trainfleet.cli.train_cmd import config_from_args
from trainfleet.errors import SpecError, TrainfleetError
from trainfleet.train.config import load_train_config
from trainfleet.train.user_deepspeed import check_user_deepspeed

pytestmark = pytest.mark.unit

HF_COMMAND = (
    "train --model_name_or_path /m --data d.jsonl --output_dir /o "
    "--per_device_train_batch_size 4 --num_train_epochs 2 --learning_rate 1e-5 --bf16 "
    "--gradient_accumulation_steps 8 --save_steps 50 --logging_steps 5 --warmup_ratio 0.03 "
    "--lr_scheduler_type linear --gradient_checkpointing --deepspeed ds.json "
    "--save_total_limit 3 --weight_decay 0.1 --max_grad_norm 0.5 --seed 7"
)


def _config(argv: str):
    return config_from_args(build_parser().parse_args(argv.split()))


def test_the_training_arguments_names_users_type_map_onto_trains_settings():
    config = _config(HF_COMMAND)
    assert (config.model, config.output, config.micro_batch_size) == ("/m", "/o", 4)
    assert (config.num_train_epochs, config.max_steps) == (2.0, None)
    assert (config.learning_rate, config.precision, config.grad_ckpt) == (1e-5, "bf16", True)
    assert (config.gradient_accumulation_steps, config.save_steps, config.logging_steps) == (
        8, 50, 5,
    )  # fmt: skip
    assert (config.warmup_ratio, config.lr_scheduler) == (0.03, "linear")
    assert (config.deepspeed_config, config.keep_checkpoints, config.seed) == ("ds.json", 3, 7)
    assert (config.weight_decay, config.max_grad_norm) == (0.1, 0.5)


@pytest.mark.parametrize(
    ("flags", "precision"),
    [
        ("--bf16", "bf16"),
        ("--bf16 true", "bf16"),
        ("--fp16 True", "fp16"),
        ("--bf16 false", "fp32"),
    ],
)
def test_hf_precision_flags(flags, precision):
    assert _config(f"train --model m --data d --output o {flags}").precision == precision


def test_both_precisions_or_an_abbreviation_are_refused():
    with pytest.raises(TrainfleetError, match="--bf16 and --fp16"):
        _config("train --model m --data d --output o --bf16 --fp16")
    # `--deepspeed` is a flag of its own now; a prefix of a flag is no longer that flag.
    with pytest.raises(SystemExit):
        build_parser().parse_args("train --model m --data d --output o --deepspeed-c x".split())


def test_train_yaml_takes_hf_names_too(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("model_name_or_path: /m\ndata: d.jsonl\noutput_dir: /o\n"
                    "per_device_train_batch_size: 2\nnum_train_epochs: 1.5\n")  # fmt: skip
    config = load_train_config(path, {})
    assert (config.model, config.output, config.micro_batch_size) == ("/m", "/o", 2)
    path.write_text("model: /m\nmodel_name_or_path: /n\ndata: d\noutput: o\n")
    with pytest.raises(SpecError, match="model_name_or_path and model both set") as err:
        load_train_config(path, {})
    assert err.value.line == 2


@pytest.mark.parametrize(
    ("rows", "world", "micro", "accum", "epochs", "steps"),
    [
        (4518, 2, 8, 1, 1.0, 283),  # ceil(4518 / (2 x 8)) batches per rank
        (4518, 2, 8, 4, 1.0, 71),  # 283 batches: 70 whole accumulations and one begun
        (4518, 2, 8, 4, 2.5, 178),  # ceil(2.5 x 71)
        (10, 16, 1, 8, 3.0, 3),  # fewer batches than one accumulation: 1 step per epoch
        (400, 2, 4, 1, 0.3, 15),  # the sandbox export test's shape
    ],
)
def test_epochs_become_steps_as_hf_trainer_counts_them(rows, world, micro, accum, epochs, steps):
    config = load_train_config(
        None,
        {"model": "m", "data": "d", "output": "o", "micro_batch_size": micro,
         "gradient_accumulation_steps": accum, "num_train_epochs": epochs},
    )  # fmt: skip
    assert config.with_steps(rows, world).max_steps == steps
    assert _hf_steps(rows, world, micro, accum, epochs) == steps


def _hf_steps(rows: int, world: int, micro: int, accum: int, epochs: float) -> int:
    """HF Trainer's own count: accelerate's sharded batch sampler (what each rank iterates)
    and transformers' `Trainer.set_initial_training_values`."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler
    from transformers import Trainer

    batches = BatchSampler(SequentialSampler(range(rows)), micro, drop_last=False)
    loader = BatchSamplerShard(batches, num_processes=world, process_index=0)
    trainer = types.SimpleNamespace(
        get_total_train_batch_size=lambda args: micro * accum * world,
        get_sp_size=lambda: 1,
        num_examples=lambda dataloader: rows,
    )
    args = types.SimpleNamespace(
        max_steps=-1, num_train_epochs=epochs, gradient_accumulation_steps=accum
    )
    return Trainer.set_initial_training_values(trainer, args, loader)[-1]


def test_max_steps_wins_over_epochs_and_warmup_is_counted_as_hf_counts_it():
    base = {"model": "m", "data": "d", "output": "o"}
    config = load_train_config(None, {**base, "max_steps": 40, "num_train_epochs": 9.0})
    assert config.with_steps(1000, 2).max_steps == 40
    ratio = load_train_config(None, {**base, "max_steps": 100, "warmup_ratio": 0.03})
    assert ratio.with_steps(1000, 2).warmup_steps == 3  # ceil(100 x 0.03), HF 4's name
    share = load_train_config(None, {**base, "max_steps": 100, "warmup_steps": 0.05})
    assert share.with_steps(1000, 2).warmup_steps == 5  # HF 5: warmup_steps < 1 is a share
    both = load_train_config(None, {**base, "warmup_steps": 7, "warmup_ratio": 0.5})
    assert both.with_steps(1000, 2).warmup_steps == 7
    assert load_train_config(None, base).with_steps(1000, 2).max_steps == 100
    with pytest.raises(TrainfleetError, match="warmup_steps"):
        load_train_config(None, {**base, "warmup_steps": 0.1, "warmup_ratio": 0.1})
    hf_share = _config("train --model m --data d --output o --warmup_steps 0.1")
    assert hf_share.warmup_steps == 0.1


SETTINGS = {"micro_batch_size": 4, "gradient_accumulation_steps": 2, "precision": "bf16",
            "max_grad_norm": 1.0}  # fmt: skip


def _ds(tmp_path, doc) -> str:
    path = tmp_path / "ds.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_a_users_deepspeed_json_decides_zero_and_offload_for_the_preflight(tmp_path):
    path = _ds(tmp_path, {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2,
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "cpu"}},
    })  # fmt: skip
    ds, changes = check_user_deepspeed(path, SETTINGS)
    assert changes == {"zero": 3, "offload": "all"}
    assert ds["zero_optimization"]["stage"] == 3  # as the user wrote it: this is what runs
    _, changes = check_user_deepspeed(_ds(tmp_path, {"zero_optimization": {"stage": 2}}), SETTINGS)
    assert changes == {"zero": 2, "offload": "none"}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            {"train_micro_batch_size_per_gpu": 1},
            "train_micro_batch_size_per_gpu=1 but --per_device_train_batch_size 4",
        ),
        ({"gradient_accumulation_steps": 8}, "gradient_accumulation_steps=8"),
        ({"fp16": {"enabled": True}}, "fp16.enabled=true but the precision is bf16"),
        ({"bf16": {"enabled": False}}, "bf16.enabled=false but the precision is bf16"),
        ({"zero_optimization": {"stage": 4}}, "stage 4 is not a ZeRO stage"),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            "offload_param needs ZeRO stage 3",
        ),
        ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, "'gpu'"),
        ('{"zero_optimization": {"stage": 3,}}', ":1:"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_deepspeed_json_hf_or_deepspeed_would_refuse_on_every_rank_is_refused_here(
    tmp_path, doc, says
):
    with pytest.raises(TrainfleetError) as err:
        check_user_deepspeed(_ds(tmp_path, doc), SETTINGS)
    assert says in str(err.value)
    assert "ds.json" in str(err.value)


def test_a_missing_deepspeed_json_names_the_flag(tmp_path):
    with pytest.raises(TrainfleetError, match="--deepspeed .*no such file"):
        check_user_deepspeed(str(tmp_path / "nope.json"), SETTINGS)


def test_training_arguments_are_built_without_deprecation_warnings(tmp_path):
    """transformers 5 renamed gradient_checkpointing to activation_checkpointing; the old name
    printed a deprecation warning on every rank."""
    from transformers import TrainingArguments

    from trainfleet.train.worker import training_arguments

    config = load_train_config(
        None,
        {"model": "m", "data": "d", "output": str(tmp_path), "grad_ckpt": True,
         "precision": "fp32", "max_steps": 3},
    )  # fmt: skip
    # No backend: a single process here, without a process group to join.
    kwargs = training_arguments(config, ds=None, on_cpu=True, backend=None,
                                fields=TrainingArguments)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        args = TrainingArguments(**kwargs)
    assert args.activation_checkpointing is True
