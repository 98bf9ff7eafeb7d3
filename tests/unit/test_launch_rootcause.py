"""The first real error across nodes, from the lines the ranks printed."""

from __future__ import annotations

import pytest

from trainfleet.launch.rootcause import ErrorTracker

pytestmark = pytest.mark.unit

TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
shim.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_20:49:27
  host      : gpu-node-2
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 21939)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_20:49:27
  host      : gpu-node-2
  rank      : 3 (local_rank: 1)
  exitcode  : 3 (pid: 21946)
  error_file: <N/A>
============================================================"""


def _traceback(tracker, t, node, rank, last):
    tracker.feed(t, node, rank, "Traceback (most recent call last):")
    tracker.feed(t, node, rank, '  File "train.py", line 9, in <module>')
    tracker.feed(t, node, rank, last)


def test_a_later_real_error_wins_over_earlier_consequences():
    tracker = ErrorTracker()
    _traceback(tracker, 1.0, "n1", 0, "RuntimeError: [pair.cc:553] Connection closed by peer")
    _traceback(tracker, 1.5, "n3", 4, "torch.distributed.DistNetworkError: timed out")
    _traceback(tracker, 2.0, "n2", 3, "ValueError: labels and logits differ in shape")
    root = tracker.root_cause("n1")
    assert (root.node, root.rank, root.text) == (
        "n2",
        3,
        "ValueError: labels and logits differ in shape",
    )
    assert not root.consequence


def test_a_silent_exit_is_named_from_torchruns_summary_on_the_first_node_that_failed():
    tracker = ErrorTracker()
    _traceback(tracker, 1.0, "gpu-node-1", 1, "RuntimeError: Connection closed by peer [10.0.0.12]")
    for line in TORCHRUN_SUMMARY.splitlines():
        tracker.feed(1.2, "gpu-node-2", None, line)
    root = tracker.root_cause("gpu-node-2")
    assert (root.node, root.rank, root.exitcode) == ("gpu-node-2", 3, 3)
    assert tracker.summaries == {"gpu-node-2": (3, 3)}


def test_only_consequences_give_the_earliest_of_them():
    tracker = ErrorTracker()
    _traceback(tracker, 2.0, "n2", 1, "RuntimeError: Connection reset by peer")
    _traceback(tracker, 1.0, "n1", 0, "torch.distributed.DistStoreError: Socket Timeout")
    root = tracker.root_cause()
    assert (root.node, root.consequence) == ("n1", True)
    assert ErrorTracker().root_cause() is None


def test_a_silent_exit_reported_by_the_shim_beats_the_consequences_of_other_ranks():
    tracker = ErrorTracker()
    _traceback(tracker, 2.0, "n1", 0, "RuntimeError: Connection closed by peer [10.0.0.12]")
    tracker.note_exit(2.1, "n1", 0, 1)
    tracker.note_exit(1.5, "n2", 3, 3)
    root = tracker.root_cause("n1")
    assert (root.node, root.rank, root.exitcode) == ("n2", 3, 3)
    assert root.text == "rank 3 exited with code 3"


def test_a_rank_s_own_exit_code_beats_a_traceback_the_launcher_prints_after_it():
    """crash_until_restart.py's rank 1 exits 3 without a traceback; DeepSpeed's runner, stopping
    the other node, then printed `SystemExit: 1` from its signal handler inside an atexit
    callback (seen once in a fresh clone's cluster tier)."""
    tracker = ErrorTracker()
    tracker.note_exit(4.2, "gpu-node-2", 1, 3)
    _traceback(tracker, 4.5, "gpu-node-1", 0, "RuntimeError: Connection closed by peer")
    tracker.feed(7.0, "deepspeed", None, "Exception ignored in atexit callback: <bound method>")
    _traceback(tracker, 7.1, "deepspeed", None, "SystemExit: 1")
    root = tracker.root_cause("gpu-node-2")
    assert (root.node, root.rank, root.text) == ("gpu-node-2", 1, "rank 1 exited with code 3")
    # A real error before the exit is still the cause; a rank killed by a signal (negative
    # code, often stopped because of another rank's error) does not outrank a real error.
    tracker = ErrorTracker()
    _traceback(tracker, 4.0, "gpu-node-1", 0, "ValueError: bad shape")
    tracker.note_exit(4.2, "gpu-node-2", 1, 3)
    assert tracker.root_cause().text == "ValueError: bad shape"
    tracker = ErrorTracker()
    tracker.note_exit(4.2, "gpu-node-2", 1, -15)
    _traceback(tracker, 4.5, "gpu-node-1", 0, "ValueError: bad shape")
    assert tracker.root_cause().text == "ValueError: bad shape"


@pytest.mark.parametrize(
    ("last_line", "says"),
    [
        # seen here: TRL's sft.py, a ZeRO-3 JSON with "train_batch_size": "auto", --use_cpu
        ("AssertionError: Check batch related parameters. train_batch_size is not equal to "
         "micro_batch_per_gpu * gradient_acc_step * world_size 8 != 4 * 1 * 1",
         "leave train_batch_size out"),
        ("RuntimeError: Ninja is required to load C++ extensions", "pip install ninja"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
         "trainfleet plan"),
        ("RuntimeError: CUDA error: invalid device ordinal", "nvidia-smi -L"),
        ("ModuleNotFoundError: No module named 'flash_attn'", "python:"),
        ("OSError: [Errno 28] No space left on device", "free space"),
        # seen on an H200: DeepSpeed 0.19.8's FusedAdam build under torch 2.11+cu130
        ("ValueError: invalid literal for int() with base 10: '0a'",
         "TORCH_CUDA_ARCH_LIST=9.0"),
    ],
)  # fmt: skip
def test_a_root_cause_with_a_known_cause_comes_with_its_fix(last_line, says):
    tracker = ErrorTracker()
    _traceback(tracker, 1.0, "gpu-node-2", 1, last_line)
    root = tracker.root_cause()
    assert root.text == last_line
    assert says in root.to_json()["fix"]


def test_an_unknown_error_has_no_made_up_fix():
    tracker = ErrorTracker()
    _traceback(tracker, 1.0, "gpu-node-2", 1, "ValueError: bad shape (3, 4)")
    assert tracker.root_cause().to_json()["fix"] is None
    # a batch assertion that counted the ranks right is the user's own mismatch, not this one
    from trainfleet.launch.rootcause import known_fix

    right = "AssertionError: ... world_size 8 != 2 * 1 * 2"
    assert known_fix(right) is None
