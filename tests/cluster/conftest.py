"""Fixtures shared by the cluster tests that run `trainfleet train` (test_train, test_chaos)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from train_jobs import train_job_processes

from session_scope import own_sandbox_name


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


_module_names = itertools.count(1)


@pytest.fixture(scope="module")
def module_sandbox(request):
    """One sandbox for a whole module whose tests run one after the other on the same cluster,
    shaped by the module's SANDBOX dict (`sandbox.up`'s arguments); down after the module."""
    from trainfleet import sandbox

    name = own_sandbox_name("m", f"{next(_module_names):04d}")
    made = sandbox.up(name=name, **request.module.SANDBOX)
    try:
        yield made
    finally:
        sandbox.down(name)
