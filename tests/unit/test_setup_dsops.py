"""DeepSpeed's ops during `setup pyenv`, without nodes: which ops, what a node's report may
hold, when ninja counts a build directory as current (a real ninja on a small build), and the
order of work over the nodes with their answers stubbed (the sandbox run builds the real ops on
real nodes: tests/cluster/test_setup.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from trainfleet import node as node_programs
from trainfleet.cluster import load_cluster
from trainfleet.errors import SetupError
from trainfleet.node import dsops as node_dsops
from trainfleet.node.answer import MARK
from trainfleet.setup.pyenv import dsops
from trainfleet.setup.pyenv.dsops import Built, OpsState, parse_build, parse_state
from trainfleet.setup.result import SetupResult
from trainfleet.setup.sync import transfer

pytestmark = pytest.mark.unit

NINJA = shutil.which("ninja", path=os.path.dirname(sys.executable)) or shutil.which("ninja")


def test_the_default_ops_are_what_a_zero_run_builds_and_none_is_none():
    assert dsops.chosen(None, {"deepspeed"}, cpu_torch=False) == ("fused_adam",)
    assert dsops.chosen("auto", {"deepspeed"}, cpu_torch=True) == (
        "fused_adam", "deepspeed_shm_comm")  # fmt: skip
    assert dsops.chosen("none", {"deepspeed"}, cpu_torch=True) == ()
    assert dsops.chosen(None, {"torch"}, cpu_torch=True) == ()  # no deepspeed, no ops
    assert dsops.chosen("cpu_adam, cpu_adam,fused_adam", {"deepspeed"}, cpu_torch=True) == (
        "cpu_adam", "fused_adam")  # fmt: skip
    with pytest.raises(SetupError, match=r"--ds-ops: 'x;rm -rf' is not an op name"):
        dsops.chosen("x;rm -rf", {"deepspeed"}, cpu_torch=True)
    # this machine's torch is the CPU build
    assert dsops.torch_is_cpu_only() is ("+cpu" in __import__("torch").__version__)


def test_a_nodes_state_report_is_checked_before_use():
    ops = {"fused_adam": "current", "deepspeed_shm_comm": "prebuilt", "x": "current"}
    good = MARK + json.dumps({"root": "/home/u/.cache/torch_extensions/py311_cpu", "ops": ops})
    state = parse_state("noise\n" + good, ("fused_adam", "deepspeed_shm_comm", "cpu_adam"),
                        node="n1")  # fmt: skip
    assert state.ops == {"fused_adam": "current", "deepspeed_shm_comm": "prebuilt",
                         "cpu_adam": "missing"}  # fmt: skip
    assert state.todo == ["cpu_adam"]
    odd = MARK + '{"root": "/tmp/$(reboot)", "ops": {}}'
    with pytest.raises(ValueError, match="extensions directory"):
        parse_state(odd, ("fused_adam",), node="n1")
    weird = MARK + '{"root": null, "ops": {"fused_adam": "done, trust me"}}'
    assert parse_state(weird, ("fused_adam",), node="n1").todo == ["fused_adam"]
    with pytest.raises(ValueError, match="it printed no answer line"):
        parse_state("Traceback ...", ("fused_adam",), node="n1")


def test_a_nodes_build_report_counts_an_op_it_does_not_mention_as_failed():
    lines = [
        MARK + json.dumps({"op": "fused_adam", "result": "built", "seconds": 61.2, "error": ""}),
        MARK + json.dumps({"op": "fused_adam2", "result": "built", "seconds": 1, "error": ""}),
        MARK + json.dumps({"op": "cpu_adam", "result": "exploded", "seconds": 1, "error": ""}),
        "{not an answer",
    ]  # fused_adam2 was not asked for, "exploded" is no result
    built = parse_build("\n".join(lines), ("fused_adam", "cpu_adam"), node="n1")
    assert built == [Built(op="fused_adam", result="built", seconds=61.2),
                     Built(op="cpu_adam", result="failed", error="no report")]  # fmt: skip
    lines.append(MARK + json.dumps({"op": "cpu_adam"}))  # a malformed answer: none is taken
    built = parse_build("\n".join(lines), ("fused_adam",), node="n1")
    assert built == [Built(op="fused_adam", result="failed",
                           error="its answer: no ['error', 'result', 'seconds']")]  # fmt: skip


def _ninja_build(directory: Path, source: Path) -> None:
    """A build directory shaped like torch's cpp_extension's (compile, then link rules)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "build.ninja").write_text(
        "rule compile\n  command = cp $in $out\n"
        "rule link\n  command = cp $in $out\n"
        f"build op.o: compile {source}\n"
        "build op.so: link op.o\n"
        "default op.so\n"
    )
    subprocess.run([NINJA, "-C", str(directory)], check=True, capture_output=True)


@pytest.mark.skipif(NINJA is None, reason="needs ninja (the venv's, from deepspeed's deps)")
def test_ninja_decides_whether_a_build_and_a_copy_of_it_are_current(tmp_path):
    target = tmp_path / "venv"
    source = target / "lib" / "op.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("int x;\n")
    built = tmp_path / "node-1" / "op"
    assert node_dsops.op_state(str(built), str(target), NINJA) == "missing"
    _ninja_build(built, source)
    assert node_dsops.op_state(str(built), str(target), NINJA) == "current"
    # another environment's build (its sources elsewhere) is not this one's
    assert node_dsops.op_state(str(built), str(tmp_path / "other"), NINJA) == "stale"
    # copied with its times (tar, as setup does): current on a node with the same files
    copy = tmp_path / "node-2"
    copy.mkdir()
    packed = subprocess.run(dsops.tar_create_argv(str(built.parent), ["op"]),
                            capture_output=True, check=True).stdout  # fmt: skip
    # unpacked as setup unpacks another node's files (no owners, no special bits)
    subprocess.run(["tar", *transfer.FOREIGN, "-C", str(copy), "-xf", "-"], input=packed,
                   check=True)  # fmt: skip
    assert node_dsops.op_state(str(copy / "op"), str(target), NINJA) == "current"
    # a source newer than the build: ninja would build, so it is not current
    os.utime(source, (source.stat().st_atime + 100, source.stat().st_mtime + 100))
    assert node_dsops.op_state(str(copy / "op"), str(target), NINJA) == "stale"
    assert node_dsops.op_state(str(copy / "op"), str(target), None) == "stale"  # no ninja


def test_the_extensions_directory_is_torchs(monkeypatch, tmp_path):
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert os.path.join(node_dsops.extensions_root(), "fused_adam") == _get_build_directory(
        "fused_adam", verbose=False)  # fmt: skip
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert node_dsops.extensions_root() == str(tmp_path / "ext")


class _Nodes:
    """The nodes' answers, stubbed: states per host, what a build there reports."""

    def __init__(self, states: dict[str, list[str]], builds: dict[str, list[Built]]):
        self.states, self.builds, self.calls = states, builds, []

    def survey(self, cluster, hosts, argv_for, target, ops, envs):
        return {
            h: OpsState(root=f"/home/{h}/ext", ops=dict(zip(ops, self.states[h], strict=True)))
            for h in hosts
        }

    def build(self, node, argv_for, target, ops, env):
        self.calls.append(("build", node.host))
        self.states[node.host] = ["current"] * len(ops)
        return self.builds[node.host]

    def copy(self, source, source_root, node, root, ops, argv_for=None):
        self.calls.append(("copy", source.host, node.host, tuple(ops)))
        return ""


def _prepare(monkeypatch, nodes: _Nodes, hosts: str) -> SetupResult:
    for name in ("survey", "build", "copy"):
        monkeypatch.setattr(dsops, name if name == "survey" else f"_{name}", getattr(nodes, name))
    result = SetupResult(step="pyenv")
    cluster = load_cluster(hosts=hosts)
    envs = {n.host: {} for n in cluster.nodes}
    dsops.prepare(cluster, argv_for=lambda p: [p], target="/v", ops=("fused_adam", "shm"),
                  envs=envs, result=result, say=lambda text: None)  # fmt: skip
    return result


def test_ops_are_built_on_one_node_and_copied_to_the_others(monkeypatch):
    ok = [Built(op="fused_adam", result="built", seconds=60), Built(op="shm", result="built")]
    same = [Built(op="fused_adam", result="current"), Built(op="shm", result="current")]
    differs = [Built(op="fused_adam", result="built", seconds=58), same[1]]
    nodes = _Nodes({"n1": ["missing"] * 2, "n2": ["stale", "missing"], "n3": ["missing"] * 2},
                   {"n1": ok, "n2": same, "n3": differs})  # fmt: skip
    result = _prepare(monkeypatch, nodes, "n1,n2,n3")
    assert nodes.calls[0] == ("build", "n1")
    both = ("fused_adam", "shm")
    assert sorted(nodes.calls[1:]) == [
        ("build", "n2"), ("build", "n3"), ("copy", "n1", "n2", both), ("copy", "n1", "n3", both)
    ]  # fmt: skip
    assert [(c.node, c.what) for c in result.changes] == [
        ("n1", "built DeepSpeed ops fused_adam (60 s), shm (0 s)"),
        ("n2", "DeepSpeed ops fused_adam, shm: copied from n1"),
        ("n3", "built DeepSpeed ops fused_adam (58 s), shm (the copy from n1 did not fit here)"),
    ]


def test_a_node_reporting_its_ops_current_is_never_the_source_and_a_failed_build_says_so(
    monkeypatch,
):
    """F10: n1 says its ops are current; the source is n2, the node this run builds on, and
    n1's build directories go nowhere."""
    ok = [Built(op="fused_adam", result="built", seconds=60), Built(op="shm", result="built")]
    same = [Built(op="fused_adam", result="current"), Built(op="shm", result="current")]
    nodes = _Nodes({"n1": ["current"] * 2, "n2": ["stale", "missing"], "n3": ["missing"] * 2},
                   {"n2": ok, "n3": same})  # fmt: skip
    result = _prepare(monkeypatch, nodes, "n1,n2,n3")
    both = ("fused_adam", "shm")
    assert nodes.calls == [("build", "n2"), ("copy", "n2", "n3", both), ("build", "n3")]
    assert [(c.node, c.what) for c in result.changes] == [
        ("n2", "built DeepSpeed ops fused_adam (60 s), shm (0 s)"),
        ("n3", "DeepSpeed ops fused_adam, shm: copied from n2"),
    ]
    nodes = _Nodes({"n1": ["stale", "current"], "n2": ["current"] * 2}, {"n1": same})
    result = _prepare(monkeypatch, nodes, "n1,n2")
    assert nodes.calls == [("build", "n1")]  # its own build: ninja finds what is current
    assert [c.what for c in result.changes] == ["built DeepSpeed ops fused_adam, shm"]

    nodes = _Nodes({"n1": ["current"] * 2}, {})
    assert _prepare(monkeypatch, nodes, "n1").changes == [] and nodes.calls == []

    broken = [Built(op="fused_adam", result="failed", error="g++: not found")]
    nodes = _Nodes({"n1": ["missing"] * 2, "n2": ["missing"] * 2}, {"n1": broken})
    with pytest.raises(SetupError) as raised:
        _prepare(monkeypatch, nodes, "n1,n2")
    assert raised.value.what == "n1: DeepSpeed's op fused_adam did not build: g++: not found"
    assert "--ds-ops none" in raised.value.fix and nodes.calls == [("build", "n1")]


def test_ops_a_node_cannot_build_are_noted_not_counted_as_changes(monkeypatch):
    odd = [Built(op="fused_adam", result="incompatible"), Built(op="shm", result="unknown")]
    nodes = _Nodes({"n1": ["missing"] * 2}, {"n1": odd})
    result = _prepare(monkeypatch, nodes, "n1")
    assert result.changes == [] and result.notes == [
        "DeepSpeed's op fused_adam: incompatible on n1, not built",
        "DeepSpeed's op shm: unknown on n1, not built",
    ]


def test_a_build_job_that_dies_is_reported_with_its_last_words():
    """Run for real on this machine (a `localhost` node): the job reports one op, then dies
    before the next (deepspeed missing there, say)."""
    said = MARK + json.dumps({"op": "fused_adam", "result": "built", "seconds": 3.0, "error": ""})
    died = "sys.stderr.write('ModuleNotFoundError: No module named deepspeed\\n'); sys.exit(1)"
    script = f"import sys; print({said!r}); {died}"
    [node] = load_cluster(hosts="localhost").nodes
    built = dsops._build(node, lambda program: [sys.executable, "-c", script], "/v",
                         ("fused_adam", "shm"), {})  # fmt: skip
    assert built == [
        Built(op="fused_adam", result="built", seconds=3.0),
        Built(op="shm", result="failed", error="ModuleNotFoundError: No module named deepspeed"),
    ]


def _copy_between_two_local_nodes(monkeypatch, tmp_path: Path) -> tuple[Path, Path]:
    """`prepare` over two nodes of this machine (`localhost` builds, `127.0.0.1` gets the copy)
    with the real copy: tar, the staged unpacking, `take_staged`; the builds are stubbed.
    -> (the source's extensions directory, the receiver's)."""
    roots = {"localhost": tmp_path / "src", "127.0.0.1": tmp_path / "dst"}
    for root in roots.values():
        root.mkdir(exist_ok=True)

    def survey(cluster, hosts, argv_for, target, ops, envs):
        return {h: OpsState(root=str(roots[h]), ops=dict.fromkeys(ops, "missing")) for h in hosts}

    def build(node, argv_for, target, ops, env):
        result = "built" if node.host == "localhost" else "current"
        return [Built(op=op, result=result) for op in ops]

    monkeypatch.setattr(dsops, "survey", survey)
    monkeypatch.setattr(dsops, "_build", build)
    cluster = load_cluster(hosts="localhost,127.0.0.1")
    dsops.prepare(cluster, argv_for=lambda program: node_programs.argv(sys.executable, program),
                  target="/v", ops=("fused_adam",), envs={n.host: {} for n in cluster.nodes},
                  result=SetupResult(step="pyenv"), say=lambda text: None)  # fmt: skip
    return roots["localhost"], roots["127.0.0.1"]


def test_a_copied_op_lands_without_owners_or_setuid_setgid_sticky_bits(monkeypatch, tmp_path):
    """F10: the source's files keep their times (ninja compares them) and lose their owner
    and special bits, also when root unpacks them (as on the sandbox and in CI)."""
    op = tmp_path / "src" / "fused_adam"
    (op / "sub").mkdir(parents=True)
    (op / "build.ninja").write_text("rule link\n")
    so = op / "fused_adam.so"
    so.write_bytes(b"\x7fELF")
    if os.geteuid() == 0:
        os.chown(so, 4242, 4242)
    so.chmod(0o4755)
    (op / "sub").chmod(0o3777)
    os.utime(so, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    old = tmp_path / "dst" / "fused_adam"
    old.mkdir(parents=True)
    (old / "stale.o").write_text("from an older build")

    _, dst = _copy_between_two_local_nodes(monkeypatch, tmp_path)
    copied = dst / "fused_adam" / "fused_adam.so"
    assert copied.read_bytes() == b"\x7fELF"
    assert stat.S_IMODE(copied.stat().st_mode) & 0o7000 == 0
    assert stat.S_IMODE((dst / "fused_adam" / "sub").stat().st_mode) & 0o7000 == 0
    assert copied.stat().st_uid == os.geteuid()
    assert copied.stat().st_mtime_ns == 1_700_000_000_123_456_789
    assert not (dst / "fused_adam" / "stale.o").exists()  # the copy replaced the directory
    assert sorted(p.name for p in dst.iterdir()) == ["fused_adam"]  # no stage left


def _hostile_archive(path: Path) -> None:
    """What a hostile source could send: a build directory with a symlink out of it and a fifo."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, extra in (
            ("fused_adam", tarfile.DIRTYPE, {}),
            ("fused_adam/fused_adam.so", tarfile.REGTYPE, {}),
            ("fused_adam/evil", tarfile.SYMTYPE, {"linkname": "/etc/passwd"}),
            ("fused_adam/pipe", tarfile.FIFOTYPE, {}),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, 0o755
            for key, value in extra.items():
                setattr(info, key, value)
            data = b"\x7fELF" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_copy_holding_a_symlink_or_a_fifo_is_refused_whole(monkeypatch, tmp_path):
    """F10: a symlink (here to /etc/passwd) or a fifo is never part of a build directory: the
    receiving node takes none of the copy, and the error names the source and the entries."""
    archive = tmp_path / "hostile.tar"
    _hostile_archive(archive)
    monkeypatch.setattr(dsops, "tar_create_argv", lambda root, ops: ["cat", str(archive)])
    with pytest.raises(SetupError) as raised:
        _copy_between_two_local_nodes(monkeypatch, tmp_path)
    what = raised.value.what
    assert what.startswith("127.0.0.1: copying DeepSpeed's ops from localhost: the archive holds")
    assert "fused_adam/evil (a symlink)" in what and "fused_adam/pipe (a fifo)" in what
    assert "nothing of it was taken" in what
    assert list((tmp_path / "dst").iterdir()) == []  # nothing taken, no stage left


def test_take_staged_takes_only_a_stage_it_was_made_for(tmp_path, capsys):
    from trainfleet.node import files

    root = tmp_path / "ext"
    (root / "fused_adam").mkdir(parents=True)
    elsewhere = tmp_path / f"{files.STAGE_PREFIX}x"
    (elsewhere / "fused_adam").mkdir(parents=True)
    job = {"root": str(root), "stage": str(elsewhere), "names": ["fused_adam"]}
    assert files.take_staged(job) == 3  # not in root: never moved from
    assert (elsewhere / "fused_adam").is_dir() and "is not a directory" in capsys.readouterr().err
    stage = root / f"{files.STAGE_PREFIX}abc"
    (stage / "fused_adam").mkdir(parents=True)
    stage.chmod(0o755)  # others could have put files in it
    assert files.take_staged({**job, "stage": str(stage)}) == 3
    stage.chmod(0o700)
    assert files.take_staged({**job, "stage": str(stage), "names": ["..", "fused_adam"]}) == 0
    said = node_programs.read_answer(capsys.readouterr().out, files.StagedAnswer, node="here")
    assert said == {"taken": ["fused_adam"]} and not stage.exists()
