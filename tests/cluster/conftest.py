"""Fixtures shared by the cluster tests that run `trainfleet train` (test_train, test_chaos)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from train_jobs import train_job_processes


@pytest.fixture
def no_train_job_left_behind():
    """After the test: no process of the job may be left on any node (15 s to stop)."""
    yield
    deadline = time.monotonic() + 15
    while train_job_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert train_job_processes() == []


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """The built-in demo's tiny Llama and character tokenizer, and 400 of its chats."""
    from trainfleet.train import demo_assets

    root = tmp_path_factory.mktemp("assets")
    demo_assets.write_tokenizer(root / "model")
    demo_assets.write_model(root / "model", tokenizer_dir=root / "model", seed=0)
    return {"model": root / "model", "data": demo_assets.write_dataset(root / "data.jsonl", n=400)}
