"""sync's decisions (which nodes get a copy) and its transports' commands; the tar transport
and its prune run for real against this machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
from doctor_fixtures import facts_of

from trainfleet import node
from trainfleet.cluster import Node, SshOptions
from trainfleet.errors import SetupError
from trainfleet.node import files
from trainfleet.setup.sync import transfer
from trainfleet.setup.sync.step import _check_directory, copy_targets, storage_groups

pytestmark = pytest.mark.unit


def _facts(sha, shared=()):
    return facts_of({"code": {"sha256": sha}, "active": {"shared": {p: True for p in shared}}})


def test_nodes_with_this_machines_code_are_left_alone():
    facts = {"a": _facts("h1"), "b": _facts("h2"), "c": _facts("h1")}
    assert copy_targets(facts, "h1") == (["b"], ["a", "c"])


def test_nodes_sharing_storage_get_one_copy():
    facts = {"a": _facts("old", ["b"]), "b": _facts("old", ["a"]), "c": _facts("old")}
    assert storage_groups(facts) == [["a", "b"], ["c"]]
    assert copy_targets(facts, "new") == (["a", "c"], ["b"])


def test_every_node_on_one_shared_store_with_the_same_code_needs_nothing():
    facts = {h: _facts("h1", [p for p in "abc" if p != h]) for h in "abc"}
    assert copy_targets(facts, "h1") == ([], ["a", "b", "c"])


def test_rsync_deletes_but_never_touches_excluded_paths():
    node = Node(
        host="gpu-node-2",
        slots=1,
        gpu_ids=(0,),
        python="python3",
        ssh=SshOptions(config_file="/s/ssh_config", user="tfuser"),
    )
    argv = transfer.rsync_argv(node, "/work/proj/", ["outputs", ".git"])
    assert argv[:4] == ["rsync", "-a", "--delete", "--protect-args"]
    assert "--exclude=outputs" in argv and "--exclude=.git" in argv
    assert argv[-2:] == ["/work/proj/", "gpu-node-2:/work/proj/"]
    remote_shell = argv[argv.index("-e") + 1]
    assert remote_shell.startswith("ssh -F /s/ssh_config ") and "-l tfuser" in remote_shell
    assert "BatchMode=yes" in remote_shell


def test_method_choice():
    assert transfer.choose_method("tar", {"a": True}) == {"a": "tar"}
    assert transfer.choose_method("rsync", {"a": False}) == {"a": "rsync"}
    here = shutil.which("rsync") is not None
    auto = transfer.choose_method("auto", {"a": True, "b": False})
    assert auto == {"a": "rsync" if here else "tar", "b": "tar"}


def test_members_leave_out_excluded_components(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_text("x")
    (tmp_path / "pkg" / "m.py").write_text("x")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "ckpt.bin").write_text("x")
    (tmp_path / "train.py").write_text("x")
    assert transfer.members(str(tmp_path), ["__pycache__", "outputs"]) == [
        "pkg",
        "pkg/m.py",
        "train.py",
    ]


def test_the_prune_removes_exactly_what_this_machine_does_not_have(tmp_path):
    for rel in ("train.py", "stale.py", "old/x.py", "outputs/ckpt.bin", "pkg/m.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    job = {"root": str(tmp_path), "keep": ["train.py", "pkg", "pkg/m.py"], "excludes": ["outputs"]}
    done = subprocess.run(
        node.argv(sys.executable, files),
        input=node.line(files.prune, job).decode(),
        capture_output=True,
        text=True,
        check=True,
    )
    said = node.read_answer(done.stdout, files.PruneAnswer, node="here")
    assert said == {"removed": 3}  # stale.py, old/x.py, old/
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["outputs", "outputs/ckpt.bin", "pkg", "pkg/m.py", "train.py"]


@pytest.mark.parametrize("directory", ["/", "/etc", "/usr/lib", "/var/lib/apt", "/mnt", "/tmp"])
def test_sync_never_mirrors_a_system_or_top_level_directory(directory):
    """#17: --delete on the nodes' copy of /etc or /usr would remove what this machine lacks."""
    with pytest.raises(SetupError, match="refusing to sync"):
        _check_directory(directory)


def test_a_project_directory_is_fine(tmp_path):
    assert _check_directory(str(tmp_path)) == str(tmp_path.resolve())


def test_a_nodes_environment_inside_the_code_directory_is_never_copied_over_or_deleted():
    """`setup pyenv --venv /work/proj/env` then `sync /work/proj`: with --delete the nodes'
    environment would go (this machine has no /work/proj/env), so it is left out by name."""
    from trainfleet.cluster import load_cluster
    from trainfleet.setup.sync.step import DEFAULT_EXCLUDES, environments_inside

    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    nodes = tuple(replace(n, python="/work/proj/env/bin/python") for n in cluster.nodes)
    cluster = replace(cluster, nodes=nodes)
    assert environments_inside(cluster, "/work/proj", DEFAULT_EXCLUDES) == ["env"]
    assert environments_inside(cluster, "/work/other", DEFAULT_EXCLUDES) == []
    nodes = tuple(replace(n, python="/work/proj/.venv/bin/python") for n in cluster.nodes)
    assert environments_inside(replace(cluster, nodes=nodes), "/work/proj", DEFAULT_EXCLUDES) == []
