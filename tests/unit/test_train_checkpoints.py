"""train's checkpoints: only its own are ever removed or rotated, and `latest` names a checkpoint
only after its files, its mark and its directories reached the disk (#17)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainfleet.errors import TrainfleetError
from trainfleet.train import check_output_dir, checkpoints

pytestmark = pytest.mark.unit


def _hf_checkpoint(output: Path, step: int) -> Path:
    """What a plain Hugging Face run leaves: checkpoint-N with its files, no mark of ours."""
    path = output / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "trainer_state.json").write_text("{}")
    return path


def _save(output: Path, step: int, *, complete: bool, keep: int = 2) -> Path:
    name = f"checkpoint-{step}"
    checkpoints.begin_save(output, name)
    (output / name / "global_step").mkdir()
    (output / name / "global_step" / "shard.pt").write_bytes(b"shard")
    if complete:
        checkpoints.mark_complete(output, name, keep=keep)
    return output / name


def test_a_hugging_face_runs_checkpoints_are_never_removed_and_train_refuses_the_directory(
    tmp_path,
):
    theirs = [_hf_checkpoint(tmp_path, step) for step in (500, 1000)]
    assert checkpoints.foreign_checkpoints(tmp_path) == theirs
    with pytest.raises(TrainfleetError, match="2 checkpoint.s. trainfleet did not write") as err:
        check_output_dir(tmp_path)
    assert "checkpoint-500, checkpoint-1000" in err.value.what
    assert "another --output" in err.value.fix
    # Even in that directory, a resume's clean-up and the rotation leave them alone.
    partial = _save(tmp_path, 4, complete=False)
    for step in (8, 12, 16):
        _save(tmp_path, step, complete=True, keep=1)
    assert checkpoints.remove_partial(tmp_path) == [partial]
    assert all((p / "model.safetensors").read_bytes() == b"weights" for p in theirs)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-1000", "checkpoint-16", "checkpoint-500"
    ]  # fmt: skip
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-16"


def test_an_empty_or_missing_output_directory_is_fine(tmp_path):
    check_output_dir(tmp_path / "new")
    check_output_dir(tmp_path)
    _save(tmp_path, 4, complete=True)
    check_output_dir(tmp_path)  # its own checkpoints: a resume
    (tmp_path / "checkpoint-8").mkdir()  # a kill between begin_save's mkdir and its mark
    check_output_dir(tmp_path)
    assert checkpoints.remove_partial(tmp_path) == [tmp_path / "checkpoint-8"]


def test_latest_names_a_checkpoint_only_after_everything_in_it_is_on_disk(tmp_path, monkeypatch):
    synced: list[str] = []
    paths: dict[int, str] = {}
    real_open, real_fsync = os.open, os.fsync

    def opening(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        paths[fd] = os.path.relpath(path, tmp_path)
        return fd

    def fsync(fd):
        synced.append(paths.get(fd, "?"))
        real_fsync(fd)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", fsync)
    seen_latest_when: list[list[str]] = []
    real_replace = os.replace

    def replace(src, dst):
        seen_latest_when.append(list(synced))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)

    _save(tmp_path, 8, complete=True)

    ckpt = "checkpoint-8"
    files = {f"{ckpt}/{checkpoints.SAVING}", f"{ckpt}/global_step/shard.pt"}
    (before,) = seen_latest_when
    assert files | {f"{ckpt}/global_step", f"{ckpt}/{checkpoints.COMPLETE}", ckpt} <= set(before)
    # every file before the completion mark, the mark before its directory, all before `latest`
    mark = before.index(f"{ckpt}/{checkpoints.COMPLETE}")
    assert all(before.index(f) < mark for f in files)
    assert before.index(ckpt, mark) > mark
    assert before[-1] == f".{checkpoints.LATEST}.tmp"
    assert synced[-1] == "."  # the output directory, after the pointer's rename


def test_a_stop_between_the_mark_and_the_pointer_switch_resumes_from_the_marked_checkpoint(
    tmp_path, monkeypatch
):
    """Ctrl-C reaches rank 0 after checkpoint-16's mark, before `latest` moves (seen in CI:
    the user's interrupt landed in that window). Everything in checkpoint-16 is on disk, so the
    restart resumes from it, and its rank 0 points `latest` at it again."""
    _save(tmp_path, 8, complete=True)
    real_replace = os.replace

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 16, complete=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / checkpoints.LATEST).read_text() == "checkpoint-8\n"
    assert checkpoints.remove_partial(tmp_path) == []
    assert checkpoints.latest_checkpoint(tmp_path).name == "checkpoint-16"
    assert checkpoints.repoint_latest(tmp_path) == "checkpoint-16"
    assert (tmp_path / checkpoints.LATEST).read_text() == "checkpoint-16\n"
    assert checkpoints.repoint_latest(tmp_path) is None  # already right: nothing written
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-16", "checkpoint-8"
    ]  # fmt: skip
