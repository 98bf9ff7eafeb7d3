"""The launch backends behind one protocol (launch/backend.py): the registry, and a channel
that carries several nodes' output (DeepSpeed's runner over pdsh) read by its own backend."""

from __future__ import annotations

import inspect
import io

import pytest

from trainfleet.errors import TrainfleetError
from trainfleet.launch import BACKENDS, backend_for
from trainfleet.launch.backend import Channel, LaunchBackend
from trainfleet.launch.deepspeed import DeepSpeedPlan, NodeTableEntry, pdsh_line
from trainfleet.launch.output import MergedOutput
from trainfleet.launch.plan import Backend, LaunchOptions

pytestmark = pytest.mark.unit

PROTOCOL = {
    name: inspect.signature(member)
    for name, member in vars(LaunchBackend).items()
    if callable(member) and not name.startswith("_")
}


def test_every_backend_the_cli_offers_is_registered_and_has_the_whole_protocol():
    assert set(BACKENDS) == set(Backend.ALL)
    assert set(PROTOCOL) == {"plan", "render", "node_envs", "start", "stop"}
    for name, backend in BACKENDS.items():
        assert backend.name == name
        for method, signature in PROTOCOL.items():
            mine = inspect.signature(getattr(type(backend), method))
            assert list(mine.parameters) == list(signature.parameters), (name, method)


def test_an_unknown_backend_is_an_error_naming_the_known_ones():
    with pytest.raises(TrainfleetError) as err:
        backend_for("slurm")
    assert "no launch backend 'slurm'" in str(err.value) and "ssh, deepspeed" in err.value.fix


def _ds_plan() -> DeepSpeedPlan:
    table = [
        NodeTableEntry(host="gpu-node-1", first_rank=0, slots=2, env={}, sources={}),
        NodeTableEntry(host="gpu-node-2", first_rank=2, slots=2, env={}, sources={}),
    ]
    return DeepSpeedPlan(
        options=LaunchOptions(command=("train.py",), backend=Backend.DEEPSPEED, run_id="r1"),
        master="gpu-node-1", master_addr="10.0.0.1", master_port=29500, hostfile="",
        node_table=table, node_dir="/tmp/trainfleet-r1", ds_env="", argv=[], env={}, unset=[],
        cwd="/w", notes=[],
    )  # fmt: skip


def test_pdsh_output_is_split_by_node_and_rank_and_a_node_s_end_is_noted(tmp_path):
    plan = _ds_plan()
    out = io.StringIO()
    merged = MergedOutput(plan, tmp_path, out, started=0.0)
    runner = Channel(name="deepspeed", argv=[], demux=pdsh_line)
    merged.line(runner, "stdout", "gpu-node-2: [default1]:loss 1.5")
    merged.line(runner, "stderr", "pdsh@launch: gpu-node-2: ssh exited with exit code 3")
    merged.line(runner, "stdout", "a line of the runner itself")
    merged.close()
    shown = out.getvalue().splitlines()
    assert shown[0].split() == ["[gpu-node-2:3]", "loss", "1.5"]
    assert shown[-1].split(maxsplit=1) == ["[deepspeed]", "a line of the runner itself"]
    assert merged.node_exits == [("gpu-node-2", 3)]
    assert "loss 1.5" in (tmp_path / "logs" / "gpu-node-2.rank3.log").read_text()


def test_a_channel_without_demux_keeps_every_line_as_its_node_s():
    line = Channel(name="gpu-node-1", argv=[]).split("gpu-node-2: not a prefix here")
    assert (line.node, line.text, line.node_exit) == (None, "gpu-node-2: not a prefix here", None)


def test_a_beat_behind_a_progress_bar_on_the_same_line_is_still_a_beat(tmp_path):
    """tqdm ends its updates with a carriage return, so the shim's beat for a Hugging Face
    Trainer step arrives behind the bar on one line (seen in TRL's SFT run): the bar is output,
    the beat is progress."""
    plan = _ds_plan()
    out = io.StringIO()
    merged = MergedOutput(plan, tmp_path, out, started=0.0)
    runner = Channel(name="deepspeed", argv=[], demux=pdsh_line)
    bar = " 33%|###3      | 1/3 [00:00<00:00,  4.33it/s]"
    beat = '@@trainfleet:r1:beat:2:{"step": 1, "pid": 7, "total_steps": 3}'
    merged.line(runner, "stderr", f"gpu-node-2: [default0]:{bar}{beat}")
    merged.line(runner, "stderr", f"gpu-node-2: [default0]:\r{beat.replace('1, ', '2, ')}")
    merged.close()
    assert merged.progress.rows[2]["step"] == 2 and merged.progress.rows[2]["total_steps"] == 3
    shown = out.getvalue()
    assert bar in shown and "@@trainfleet" not in shown
    assert len(shown.splitlines()) == 1  # the bare "\r" before the second beat is no line
