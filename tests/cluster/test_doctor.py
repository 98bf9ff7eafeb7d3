"""doctor against real sandboxes: every docs/findings.md entry that names this file as its
sandbox test is injected and must be reported with its id, on the right node(s), with evidence
and a fix; a clean sandbox has no error. (pdsh-missing is a check of this machine alone:
tests/unit covers it.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainfleet.cli.main import main
from trainfleet.cluster import load_cluster
from trainfleet.doctor import run_doctor
from trainfleet.doctor.findings import Severity
from trainfleet.examples import ALLREDUCE
from trainfleet.remote import run_on_nodes
from trainfleet.sandbox import hostile

pytestmark = pytest.mark.cluster

IFNAMES = ["ens14f0", "ens14f1", "ens14f2"]


def _doctor(cluster_file, **kwargs):
    cluster = load_cluster(cluster_file=str(cluster_file))
    return run_doctor(cluster, **kwargs)


def _by_id(report) -> dict[str, list]:
    found: dict[str, list] = {}
    for finding in report.findings:
        assert finding.evidence and finding.fix, finding
        found.setdefault(finding.id, []).append(finding)
    return found


def _nodes(report, pitfall: str, severity: Severity | None = None) -> set[str]:
    return {
        node
        for f in _by_id(report).get(pitfall, [])
        if severity is None or f.severity is severity
        for node in f.nodes
    }


def _with(cluster_file: Path, tmp_path: Path, **changes) -> Path:
    """A copy of a sandbox's cluster.yaml with `changes` merged in (top level, or per node)."""
    doc = yaml.safe_load(cluster_file.read_text())
    node_changes = changes.pop("nodes", {})
    for key, value in changes.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and key in doc else value
    for entry in doc["nodes"]:
        entry.update(node_changes.get(entry["host"], {}))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_clean_sandbox_has_no_errors_and_json_names_nodes_as_in_the_spec(make_sandbox, capsys):
    box = make_sandbox(nodes=3, ifnames=IFNAMES)
    code = main(["doctor", "-c", str(box.cluster_file), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert not [f for f in report["findings"] if f["id"] == "hostname-unresolvable"]
    assert list(report["nodes"]) == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    chosen = [report["nodes"][f"gpu-node-{k}"]["interface"] for k in (1, 2, 3)]
    assert chosen == IFNAMES  # what trainfleet sets per node: the route to the master
    # A real gloo all_reduce ran across the three nodes, each bound to its own interface.
    assert "collective" in report["phases"]


def test_ssh_network_and_port_faults_are_named_on_their_nodes(make_sandbox, tmp_path):
    box = make_sandbox(
        nodes=6,
        ifnames=[*IFNAMES, "eth0", "eth0", "eth0"],
        faults=[
            "firewall-blocks-ports@1",
            "port-in-use@1",
            "hostname-loopback@2",
            "mtu-mismatch@3",
            "ssh-auth-failed@4",
            "ssh-hostkey-changed@5",
            "node-down@6",
        ],
    )
    report = _doctor(_with(box.cluster_file, tmp_path, ssh={"connect_timeout": 3}))
    assert report.exit_code == 1
    assert "collective" not in report.phases  # the causes are known; no 20 s wait for it
    assert _nodes(report, "firewall-blocks-ports", Severity.ERROR) == {"gpu-node-1"}
    firewall = _by_id(report)["firewall-blocks-ports"][0]
    assert "master port 29500 gets through" in firewall.evidence[0]
    assert "iptables -I INPUT -p tcp -s" in firewall.fix and box.subnet in firewall.fix
    assert _nodes(report, "port-in-use") == {"gpu-node-1"}
    assert "pid" in _by_id(report)["port-in-use"][0].evidence[0]
    assert _nodes(report, "hostname-loopback") == {"gpu-node-2"}
    assert _nodes(report, "mtu-mismatch") == {"gpu-node-3"}
    assert _nodes(report, "ssh-auth-failed", Severity.ERROR) == {"gpu-node-4"}
    assert _nodes(report, "ssh-hostkey-changed", Severity.ERROR) == {"gpu-node-5"}
    assert _nodes(report, "ssh-unreachable", Severity.ERROR) == {"gpu-node-6"}


def test_environment_name_link_and_hostkey_faults(make_sandbox):
    box = make_sandbox(
        nodes=5,
        faults=[
            "ssh-hostkey-unknown@2",
            "remote-env-differs@4",
            "hostname-unresolvable@5",
            "firewall-ssh-only@5",
            "client-name-unresolvable@1",
        ],
    )
    report = _doctor(box.cluster_file)
    assert _nodes(report, "ssh-hostkey-unknown", Severity.ERROR) == {"gpu-node-2"}
    assert _nodes(report, "remote-env-differs") == {"gpu-node-4"}
    assert _nodes(report, "hostname-unresolvable", Severity.ERROR) == {"gpu-node-5"}
    # c10d's err=-3: the master cannot name its clients' IPv4-mapped addresses (no DNS here).
    assert _nodes(report, "hostname-unresolvable", Severity.WARNING) == {"gpu-node-1"}
    (unnamed,) = [f for f in _by_id(report)["hostname-unresolvable"] if "::ffff:" in f.fix]
    assert len([e for e in unnamed.evidence if "has no name" in e]) == 5, unnamed.evidence
    assert _nodes(report, "firewall-blocks-ports") == {"gpu-node-5"}
    assert "master port" not in _by_id(report)["firewall-blocks-ports"][0].evidence[0]


def test_slow_link_is_named(make_sandbox):
    box = make_sandbox(nodes=4, faults=["slow-link@3"])
    report = _doctor(box.cluster_file, quick=True)
    assert _nodes(report, "slow-link", Severity.WARNING) == {"gpu-node-3"}
    assert report.exit_code == 0


def test_one_global_interface_variable_for_differently_named_interfaces(make_sandbox, tmp_path):
    """Seed 000: ens14f0 on one node, ens14f1 on the other, one value for all of them."""
    box = make_sandbox(nodes=3, ifnames=IFNAMES, faults=["decoy-iface@2"])
    env = {"GLOO_SOCKET_IFNAME": "ens14f0", "NCCL_SOCKET_IFNAME": "ens14f0"}
    report = _doctor(_with(box.cluster_file, tmp_path, env=env), quick=True)
    assert _nodes(report, "iface-mismatch", Severity.ERROR) == {"gpu-node-2", "gpu-node-3"}
    evidence = " ".join(e for f in _by_id(report)["iface-mismatch"] for e in f.evidence)
    assert "Unable to find address for: ens14f0" in evidence
    # The decoys do not fool the interface choice; NCCL's default would take virbr0.
    assert report.nodes["gpu-node-2"].interface == "ens14f1"
    assert report.nodes["gpu-node-2"].nccl_default == "virbr0"


def test_decoy_interface_unset_variables(make_sandbox):
    box = make_sandbox(nodes=2, ifnames=IFNAMES[:2], faults=["decoy-iface@2"])
    report = _doctor(box.cluster_file, quick=True)
    assert _nodes(report, "iface-wrong", Severity.WARNING) == {"gpu-node-2"}
    assert "virbr0" in _by_id(report)["iface-wrong"][0].evidence[0]
    assert report.exit_code == 0


def test_missing_python_and_missing_torch(make_sandbox, tmp_path):
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")
    probe = subprocess.run([base_python, "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base_python} has torch: no interpreter without it to test with")
    box = make_sandbox(nodes=3)
    nodes = {
        "gpu-node-2": {"python": "/nonexistent/bin/python3"},
        "gpu-node-3": {"python": base_python},
    }
    report = _doctor(_with(box.cluster_file, tmp_path, nodes=nodes), quick=True)
    assert _nodes(report, "remote-path-missing", Severity.ERROR) == {"gpu-node-2"}
    assert _nodes(report, "torch-missing", Severity.ERROR) == {"gpu-node-3"}
    workdir = _with(box.cluster_file, tmp_path, workdir="/nonexistent/work")
    assert _nodes(_doctor(workdir, quick=True), "remote-path-missing") == {
        "gpu-node-1",
        "gpu-node-2",
        "gpu-node-3",
    }


def test_no_shared_storage_and_different_code(make_sandbox, tmp_path):
    local = tmp_path / "work"
    local.mkdir()
    box = make_sandbox(nodes=3, node_local_dir=str(local))
    for node in box.nodes:  # each node's private copy of the code; node 3's differs
        code = box.state_dir / "nodes" / node.hostname / "local" / "train.py"
        code.write_text("print('v2')\n" if node.index == 3 else "print('v1')\n")
    report = _doctor(_with(box.cluster_file, tmp_path, workdir=str(local)))
    assert _nodes(report, "code-differs", Severity.ERROR) == {"gpu-node-3"}
    assert _nodes(report, "shared-dir-missing", Severity.INFO) == {
        "gpu-node-1",
        "gpu-node-2",
        "gpu-node-3",
    }


def test_unreachable_node_is_reported_within_the_connect_timeout(make_sandbox, tmp_path):
    box = make_sandbox(nodes=2, faults=["node-down@2"])
    report = _doctor(_with(box.cluster_file, tmp_path, ssh={"connect_timeout": 2}), quick=True)
    assert _nodes(report, "ssh-unreachable") == {"gpu-node-2"}
    assert report.seconds < 2 + 8  # connect timeout + the probe's own bounded waits


def _fix(cluster_file: Path, capsys) -> tuple[int, dict]:
    code = main(["doctor", "-c", str(cluster_file), "--quick", "--fix", "--yes", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_fix_adds_the_unknown_host_key_then_pins_each_nodes_interface(
    make_sandbox, tmp_path, capsys
):
    box = make_sandbox(nodes=3, ifnames=IFNAMES, faults=["ssh-hostkey-unknown@2"])
    cluster_file = _with(box.cluster_file, tmp_path, env={"GLOO_SOCKET_IFNAME": "ens14f0"})
    known_hosts = yaml.safe_load(cluster_file.read_text())["ssh"]["known_hosts_file"]
    lines_before = Path(known_hosts).read_text().splitlines()

    code, first = _fix(cluster_file, capsys)

    ids = {f["id"]: f["nodes"] for f in first["findings"]}
    assert ids["ssh-hostkey-unknown"] == ["gpu-node-2"]
    [added] = first["fix"]["host_keys"]
    assert (added["target"], added["peer"], added["known_hosts"]) == (
        "this machine",
        "gpu-node-2",
        known_hosts,
    )
    assert all(f.split()[1].startswith("SHA256:") for f in added["fingerprints"])
    # gpu-node-2 was not examined yet, so only gpu-node-3's interface is pinned this round.
    assert first["fix"]["interfaces"]["nodes"] == {"gpu-node-3": "ens14f2"}
    new_lines = Path(known_hosts).read_text().splitlines()[len(lines_before) :]
    assert new_lines and all(line.startswith(added["name"] + " ") for line in new_lines)
    after = {f["id"]: f["nodes"] for f in first["after_fix"]["findings"]}
    assert "ssh-hostkey-unknown" not in after
    assert after["iface-mismatch"] == ["gpu-node-2"]  # examined now
    assert code == 1

    code, second = _fix(cluster_file, capsys)

    assert second["fix"]["interfaces"]["nodes"] == {"gpu-node-2": "ens14f1"}
    assert second["after_fix"]["exit_code"] == 0 and code == 0
    pinned = {n.host: n.interface for n in load_cluster(cluster_file=str(cluster_file)).nodes}
    assert pinned == {"gpu-node-1": None, "gpu-node-2": "ens14f1", "gpu-node-3": "ens14f2"}
    backups = sorted(tmp_path.glob("cluster.yaml.*"))
    assert backups and "ens14f2" not in backups[0].read_text()  # the original, kept


HOLD_A_JIT_LOCK = """\
import sys, time
from torch.utils.file_baton import FileBaton
assert FileBaton(sys.argv[1]).try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_stale_jit_lock_stops_the_launch_and_fix_removes_only_it(make_sandbox, tmp_path, capsys):
    """The leftover of a DeepSpeed op build killed midway (here: torch's own FileBaton in a
    process killed with SIGKILL): every later rank would wait for it forever at start."""
    box = make_sandbox(nodes=2)
    extensions = tmp_path / "extensions"
    cluster_file = _with(
        box.cluster_file,
        tmp_path,
        nodes={"gpu-node-2": {"env": {"TORCH_EXTENSIONS_DIR": str(extensions)}}},
    )
    lock = extensions / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_JIT_LOCK, str(lock)], stdout=subprocess.PIPE
    )
    assert holder.stdout.readline() == b"held\n"
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    try:
        assert "jit-lock-stale" not in _by_id(_doctor(cluster_file, quick=True))  # a live build
    finally:
        holder.kill()
        holder.wait()

    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    code = main(["launch", "-c", str(cluster_file), "--", str(script)])
    out, err = capsys.readouterr()
    assert code == 1 and "nothing was started" in err
    assert "jit-lock-stale" in err and "gpu-node-2" in err and str(lock) in err
    assert "the script ran" not in out + err

    code, fixed = _fix(cluster_file, capsys)

    assert fixed["fix"]["jit_locks"] == {"gpu-node-2": [str(lock)]}
    assert not lock.exists() and (extensions / "fused_adam").is_dir()  # the build is kept
    assert "jit-lock-stale" not in {f["id"] for f in fixed["after_fix"]["findings"]}
    assert code == 0


def test_a_nodes_files_never_run_as_trainfleet_and_its_words_reach_the_terminal_as_text(
    make_sandbox, capsys
):
    """gpu-node-2's home (where every ssh session starts) holds base64.py, json.py, pip.py,
    torch.py...: the node-program loader and every Python trainfleet starts ran them, as the
    user (review F3). gpu-node-3's `import torch` fails with escape sequences in its error:
    trainfleet's own summary of it reached the terminal raw, retitling and clearing it (review
    F9; the ranks' own lines are shown as they are, as ssh shows them). (doctor's rendering of
    the same text is tested in tests/unit/test_doctor_report.py: a full doctor here waits the
    collective's 60 s bound for the node whose torch does not import.)"""
    box = make_sandbox(nodes=3, faults=["planted-modules@2", "torch-import-error@3"])
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    marks = box.state_dir / "nodes" / "gpu-node-2" / hostile.MARKS
    # The planted files are real: a plain `python -c` in a session there runs them.
    plain = run_on_nodes([cluster.node("gpu-node-2")], [sys.executable, "-c", "import json"])
    assert plain[0].ok and sorted(p.name for p in marks.iterdir()) == ["json"]
    (marks / "json").unlink()

    assert main(["doctor", "-c", str(box.cluster_file), "--quick"]) == 0  # probes everywhere
    launch = [sys.executable, "-m", "trainfleet", "launch", "-c", str(box.cluster_file)]
    failed = subprocess.run(
        [*launch, "--", str(ALLREDUCE)], capture_output=True, text=True, timeout=180
    )
    done = subprocess.run(
        [*launch, "-e", "gpu-node-3", "--", str(ALLREDUCE)],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert failed.returncode == 1, failed.stdout + failed.stderr
    summary = failed.stderr  # trainfleet's own lines (the ranks' go to stdout)
    assert "root cause: gpu-node-3: ImportError: ?]0;owned by gpu-node??[2J?[H?[32m" in summary
    assert not any(c in summary for c in "\x1b\x07")
    assert "\x1b]0;owned" in failed.stdout  # (what the rank printed, as it printed it)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in marks.iterdir()) == []
