"""train.yaml and flags: what wins, what is refused and how the error names the place."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from trainfleet.errors import TrainfleetError
from trainfleet.train.config import LoraConfig, TrainConfig, load_train_config

REQUIRED = {"model": "m", "data": "d.jsonl", "output": "out"}


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(text)
    return path


def test_flags_win_over_the_file_and_unset_flags_do_not(tmp_path):
    path = _yaml(tmp_path, "model: m\ndata: d.jsonl\noutput: out\nzero: 2\nseq_len: 512\n")
    config = load_train_config(path, {"zero": 3, "seq_len": None})
    assert (config.zero, config.seq_len) == (3, 512)


def test_an_unknown_key_is_refused_with_its_line_and_the_valid_keys(tmp_path):
    path = _yaml(tmp_path, "model: m\ndata: d.jsonl\noutput: out\nlearning_rat: 1e-5\n")
    with pytest.raises(TrainfleetError) as err:
        load_train_config(path, {})
    assert f"{path}:4" in str(err.value.what) and "learning_rat" in err.value.what
    assert "learning_rate" in err.value.fix


def test_a_wrong_type_names_the_file_line_and_field(tmp_path):
    path = _yaml(tmp_path, "model: m\ndata: d.jsonl\noutput: out\n\nmax_steps: many\n")
    with pytest.raises(TrainfleetError) as err:
        load_train_config(path, {})
    assert f"{path}:5" in err.value.what and "max_steps" in err.value.what


def test_missing_required_fields_say_how_to_give_them():
    with pytest.raises(TrainfleetError) as err:
        load_train_config(None, {"model": "m"})
    assert "data, output" in err.value.what and "--data" in err.value.fix


def test_lora_section_is_checked_like_the_top_level(tmp_path):
    path = _yaml(tmp_path, "model: m\ndata: d\noutput: o\nlora:\n  rank: 8\n  alhpa: 16\n")
    with pytest.raises(TrainfleetError) as err:
        load_train_config(path, {})
    assert f"{path}:6" in err.value.what and "alpha" in err.value.fix
    config = load_train_config(
        _yaml(tmp_path, "model: m\ndata: d\noutput: o\nlora: {rank: 8}\n"), {}
    )
    assert config.lora == LoraConfig(rank=8)
    assert TrainConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"zero": 4}, "zero"),
        ({"offload": "all", "zero": 2}, "offload"),
        ({"precision": "fp8"}, "precision"),
        ({"max_steps": 0}, "max_steps"),
        ({"keep_checkpoints": 0}, "keep_checkpoints"),
        ({"learning_rate": 0.0}, "learning_rate"),
    ],
)
def test_impossible_settings_name_their_field(overrides, field):
    with pytest.raises(TrainfleetError) as err:
        load_train_config(None, {**REQUIRED, **overrides})
    assert field in f"{err.value.what} {err.value.fix}"


def test_the_train_page_documents_every_train_yaml_key():
    page = (Path(__file__).parents[2] / "docs" / "train.md").read_text()
    table = page.split("### train.yaml", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"^\| `([\w.]+)` \|", table, flags=re.M))
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    keys |= {f"lora.{f.name}" for f in dataclasses.fields(LoraConfig)}
    assert documented == keys
