"""`trainfleet setup` and `sync` against real sandboxes: fresh servers that accept only a
password, a changed host key, a firewall that drops NCCL's ports, nodes without shared
storage. Each step must end in a clean doctor, and a second run must change nothing.

The user's own ~/.ssh is never read or written (checked after each test).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from session_scope import own_sandbox_name
from trainfleet import sandbox
from trainfleet.cli.main import main
from trainfleet.cluster import load_cluster
from trainfleet.doctor import run_doctor
from trainfleet.examples import ALLREDUCE
from trainfleet.keyscan import fingerprint
from trainfleet.remote import Failure, run_on_nodes
from trainfleet.setup.pyenv import wheels
from trainfleet.train import demo_assets

pytestmark = pytest.mark.cluster


def _tree(*roots: Path) -> dict[str, str]:
    """Every file under `roots` with a hash of its content (to see that nothing changed)."""
    found = {}
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(autouse=True)
def users_own_ssh_dir_is_untouched():
    before = _tree(Path.home() / ".ssh")
    yield
    assert _tree(Path.home() / ".ssh") == before


@pytest.fixture
def make_box():
    made: list[str] = []

    def _make(index: int, **kwargs) -> sandbox.Sandbox:
        name = own_sandbox_name("s", f"{index:04d}")
        made.append(name)
        return sandbox.up(name=name, **kwargs)

    yield _make
    for name in made:
        sandbox.down(name)


def _run(argv: list[str], capsys, monkeypatch, stdin: str = "") -> tuple[int, str, str]:
    capsys.readouterr()  # only this command's output (not, say, a library's log line before)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _changes(doc: dict) -> dict[str, list[str]]:
    by_node: dict[str, list[str]] = {}
    for change in doc["changes"]:
        by_node.setdefault(change["node"], []).append(change["what"])
    return by_node


def _launch(*args: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "trainfleet", "launch", *args, "--", str(ALLREDUCE)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    return done.returncode, done.stdout + done.stderr


def test_password_only_servers_get_full_trust_and_a_second_run_changes_nothing(
    make_box, capsys, monkeypatch
):
    box = make_box(1, nodes=3, auth="password")
    cluster = load_cluster(cluster_file=str(box.cluster_file))
    fresh = run_on_nodes(cluster.nodes, ["true"])
    assert {r.failure for r in fresh} == {Failure.HOSTKEY_UNKNOWN}  # nothing is known yet
    password = box.password_file.read_text().strip()
    argv = ["setup", "ssh", "-c", str(box.cluster_file), "--password-stdin", "--yes", "--json"]

    code, out, err = _run(argv, capsys, monkeypatch, stdin=password + "\n")

    doc = json.loads(out)
    assert code == 0, (doc, err)
    assert doc["findings"] == [] and doc["checks"]
    assert "trust these keys?" in err and "ssh-ed25519 SHA256:" in err  # shown, then --yes
    changes = _changes(doc)
    for host in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
        assert any("password used once, not kept" in c for c in changes[host]), changes
        assert any(c.startswith("created key") for c in changes[host])
        assert "~/.ssh/authorized_keys: added the key(s) of gpu-node-[1-3]" in changes[host]
    # doctor itself (full: the N x N matrix) agrees, every pair including each node to itself
    report = run_doctor(cluster)
    assert [f.id for f in report.findings if f.id.startswith("ssh-")] == []
    for host, facts in report.survey.facts.items():
        matrix = facts.active.ssh
        assert sorted(matrix) == ["gpu-node-1", "gpu-node-2", "gpu-node-3"], host
        assert all(outcome.rc == 0 for outcome in matrix.values()), (host, matrix)
    homes = [box.home, *(box.state_dir / "nodes" / n.hostname / "home" for n in box.nodes)]
    state = _tree(*homes)
    assert all(password.encode() not in Path(path).read_bytes() for path in state)

    code, out, _ = _run(["setup", "ssh", "-c", str(box.cluster_file)], capsys, monkeypatch)

    assert code == 0, out
    assert out.splitlines()[0] == "trainfleet setup ssh: nothing changed"  # no password asked
    assert "no problems found" in out
    assert _tree(*homes) == state


def test_a_changed_host_key_is_shown_old_and_new_and_needs_more_than_yes(
    make_box, capsys, monkeypatch
):
    box = make_box(2, nodes=2, auth="password", faults=["ssh-hostkey-changed@2"])
    node_dir = box.state_dir / "nodes" / "gpu-node-2"
    old = fingerprint((node_dir / "previous_host_key.pub").read_text())
    new = fingerprint((node_dir / "ssh_host_ed25519_key.pub").read_text())
    known = box.home / ".ssh" / "known_hosts"
    before = _files(box)
    password = box.password_file.read_text()
    argv = ["setup", "ssh", "-c", str(box.cluster_file), "--password-stdin"]

    code, out, err = _run(argv, capsys, monkeypatch, stdin=password)

    assert code == 1
    assert "gpu-node-2 (known as gpu-node-2, " in out and ": CHANGED" in out
    assert f"was: {old}" in out and f"now: {new}" in out
    assert "not a terminal: not confirmed" in out
    assert "changed host keys were not confirmed: nothing was changed" in err
    assert _files(box) == before  # no key, no line, no login

    # --yes (what scripts pass for new keys) is still a no for a changed one (#17).
    code, out, err = _run([*argv, "--yes"], capsys, monkeypatch, stdin=password)

    assert code == 1
    assert "--yes does not replace CHANGED host keys" in out
    assert "--replace-changed-host-keys" in err
    assert _files(box) == before

    explicit = [*argv, "--yes", "--replace-changed-host-keys", "--json"]
    code, out, err = _run(explicit, capsys, monkeypatch, stdin=password)

    doc = json.loads(out)
    assert code == 0, (doc, err)
    assert doc["findings"] == []
    assert any("changed key(s) replaced for gpu-node-2" in c for c in _changes(doc)["this machine"])
    lines = known.read_text()
    assert new.split()[1] not in lines  # (fingerprints are not in the file: keys are)
    key = (node_dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    old_key = (node_dir / "previous_host_key.pub").read_text().split()[1]
    assert key in lines and old_key not in lines


def _known_hosts_lines(box: sandbox.Sandbox) -> dict[Path, list[str]]:
    """Every known_hosts file of this machine and the nodes, as lines."""
    homes = [box.home, *(box.state_dir / "nodes" / n.hostname / "home" for n in box.nodes)]
    files = [Path(p) for p in _tree(*homes) if p.endswith("known_hosts")]
    return {path: [ln for ln in path.read_text().splitlines() if ln.strip()] for path in files}


def _files(box: sandbox.Sandbox) -> dict[str, str]:
    """This machine's and the nodes' files, but the sshd logs (under load an sshd may log a
    dropped ssh-keyscan connection)."""
    found = _tree(box.home, box.state_dir / "nodes")
    return {path: digest for path, digest in found.items() if not path.endswith("sshd.log")}


def _rename(box: sandbox.Sandbox, host: str, name: str) -> None:
    """What root on the node can do: `hostname` answers `name` from now on."""
    sshd = str(box.sshd_pid(host))
    rename = f"import socket; socket.sethostname({name!r})"
    subprocess.run(["nsenter", "-t", sshd, "-u", sys.executable, "-c", rename], check=True)


def test_a_node_cannot_choose_the_names_its_key_is_trusted_under_nor_pass_yes_with_another_key(
    make_box, capsys, monkeypatch
):
    """Root on a node sets its hostname: gpu-node-2 calling itself gpu-node-1 had its key
    trusted as gpu-node-1 on this machine and every node, `*` would trust it for every host and
    a newline would add a line of its choosing (#17, review F1). A man in the middle offering
    an ECDSA key where an Ed25519 one is known passed --yes as a "new" key (review F2)."""
    box = make_box(6, nodes=3, auth="password",
                   faults=["hostname-impostor@2", "ssh-hostkey-type-changed@3"])  # fmt: skip
    node3 = box.state_dir / "nodes" / "gpu-node-3"
    ecdsa = (node3 / "ssh_host_ecdsa_key.pub").read_text().split()[1]
    known = box.home / ".ssh" / "known_hosts"
    before = _files(box)
    password = box.password_file.read_text()
    argv = ["setup", "ssh", "-c", str(box.cluster_file), "--password-stdin", "--yes"]

    code, out, err = _run(argv, capsys, monkeypatch, stdin=password)

    assert code == 1, (out, err)
    assert "gpu-node-3 (known as gpu-node-3, " in out and ": CHANGED" in out
    assert "was: ssh-ed25519 SHA256:" in out and "now: ecdsa-sha2-nistp256 SHA256:" in out
    assert "--yes does not replace CHANGED host keys" in out
    assert _files(box) == before  # no key, no line, no login
    assert ecdsa not in known.read_text()

    code, out, err = _run(
        [*argv, "--replace-changed-host-keys", "--json"], capsys, monkeypatch, stdin=password
    )

    doc = json.loads(out)
    assert code == 0, (doc, err)
    said = "gpu-node-2 says its hostname is 'gpu-node-1', which is a name of gpu-node-1"
    assert any(said in note for note in doc["notes"]), doc["notes"]
    node_keys = {
        n.hostname: (box.state_dir / "nodes" / n.hostname / "ssh_host_ed25519_key.pub")
        for n in box.nodes[:2]
    }
    key_of = {host: path.read_text().split()[1] for host, path in node_keys.items()}
    key_of["gpu-node-3"] = ecdsa
    tables = _known_hosts_lines(box)
    assert len(tables) == 4, tables  # this machine's and each node's
    for path, lines in tables.items():
        for line in lines:
            name, _, key = line.split()
            owner = next(n for n in box.nodes if name in (n.hostname, n.address))
            assert key == key_of[owner.hostname], (path, line)  # every name: its own node's key
        assert {ln.split()[0] for ln in lines} == {
            *(n.hostname for n in box.nodes),
            *(n.address for n in box.nodes),
        }, path

    hostile = {"gpu-node-2": "github.com", "gpu-node-3": "gpu-node-3\n@cert-authority *"}
    for host, name in hostile.items():
        _rename(box, host, name)

    code, out, err = _run([*argv, "--json"], capsys, monkeypatch, stdin=password)

    doc = json.loads(out)
    assert code == 0, (doc, err)
    assert doc["changes"] == []
    assert any("'github.com', which resolves here to" in note for note in doc["notes"])
    newline = "'gpu-node-3\\n@cert-authority *', which is not a host name"
    assert any(newline in note for note in doc["notes"]), doc["notes"]
    assert _known_hosts_lines(box) == tables


def _iptables(box: sandbox.Sandbox, which: int) -> list[str]:
    """iptables-save of a node without its timestamps and counters."""
    out = subprocess.run(
        box.exec_argv(which, ["iptables-save"]), capture_output=True, text=True, check=True
    ).stdout
    return [
        re.sub(r"\[\d+:\d+\]", "[0:0]", ln) for ln in out.splitlines() if not ln.startswith("#")
    ]


def _nft(box: sandbox.Sandbox, which: int, *args: str) -> str:
    argv = box.exec_argv(which, ["nft", *args])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


# What a distribution's nftables.conf with "only ssh in" looks like, plus the master port.
NFT_FIREWALL = [
    "add table inet filter",
    "add chain inet filter input { type filter hook input priority 0; policy accept; }",
    "add rule inet filter input iifname lo accept",
    "add rule inet filter input ct state established,related accept",
    "add rule inet filter input tcp dport { 22, 29500 } accept",
    "add rule inet filter input tcp flags syn drop",
]


def test_firewall_rules_let_doctor_and_a_launch_pass_and_revert_restores_them_exactly(
    make_box, tmp_path, capsys, monkeypatch
):
    """iptables on the master (the sandbox's fault), nftables on the other node."""
    box = make_box(3, nodes=2, faults=["firewall-blocks-ports@1"])
    for command in NFT_FIREWALL:
        _nft(box, 2, command)  # nft reads one argument as a whole command line
    cluster_file = tmp_path / "cluster.yaml"
    shutil.copy(box.cluster_file, cluster_file)
    original = (_iptables(box, 1), _nft(box, 2, "list", "ruleset"))
    argv = ["setup", "firewall", "-c", str(cluster_file)]

    code, out, _ = _run([*argv, "--apply", "--yes", "--json"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and doc["findings"] == [], doc
    changes = _changes(doc)
    assert changes["gpu-node-1"] == [
        f"added (iptables): iptables -I INPUT -i eth0 -s {box.node(2).address}/32 -p tcp "
        "-m comment --comment trainfleet -j ACCEPT"
    ]
    assert changes["gpu-node-2"] == [
        "added (nftables): nft insert rule inet filter input iifname eth0 ip saddr "
        f"{box.node(1).address} meta l4proto tcp accept comment trainfleet"
    ]
    state = json.loads((tmp_path / "cluster.yaml.firewall.json").read_text())
    assert sorted(state["nodes"]) == ["gpu-node-1", "gpu-node-2"]
    report = run_doctor(load_cluster(cluster_file=str(cluster_file)), quick=True)
    assert "firewall-blocks-ports" not in {f.id for f in report.findings}
    code, launched = _launch("-c", str(cluster_file), "--run-dir", str(tmp_path / "run"))
    assert code == 0 and "all 2 rank(s) on 2 node(s) finished" in launched, launched
    code, out, _ = _run([*argv, "--apply", "--yes"], capsys, monkeypatch)
    assert code == 0 and out.startswith("trainfleet setup firewall: nothing changed")

    code, out, _ = _run([*argv, "--revert", "--json"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and sorted(_changes(doc)) == ["gpu-node-1", "gpu-node-2"]
    assert (_iptables(box, 1), _nft(box, 2, "list", "ruleset")) == original
    assert not (tmp_path / "cluster.yaml.firewall.json").exists()
    blocked = {h for f in doc["findings"] if f["id"] == "firewall-blocks-ports" for h in f["nodes"]}
    assert blocked == {"gpu-node-1", "gpu-node-2"}  # back, as before


def test_setup_hostfile_writes_what_launch_accepts_and_env_pins_each_interface(
    make_box, tmp_path, capsys, monkeypatch
):
    box = make_box(4, nodes=2, ifnames=["ens14f0", "ens14f1"])
    hostfile, cluster_file = tmp_path / "hostfile", tmp_path / "cluster.yaml"
    argv = ["setup", "hostfile", "-c", str(box.cluster_file), "--slots", "2"]
    argv += ["--out", str(hostfile), "--cluster-out", str(cluster_file)]

    code, out, _ = _run(argv, capsys, monkeypatch)

    assert code == 0, out
    assert hostfile.read_text().splitlines()[1:] == ["gpu-node-1 slots=2", "gpu-node-2 slots=2"]
    assert [n.slots for n in load_cluster(cluster_file=str(cluster_file)).nodes] == [2, 2]
    code, out, _ = _run(argv, capsys, monkeypatch)
    assert code == 0 and out.startswith("trainfleet setup hostfile: nothing changed")

    code, out, _ = _run(["setup", "env", "-c", str(cluster_file)], capsys, monkeypatch)

    assert code == 0, out
    nodes = yaml.safe_load(cluster_file.read_text())["nodes"]
    assert [n["interface"] for n in nodes] == ["ens14f0", "ens14f1"]
    assert all(n["python"] == sys.executable for n in nodes)
    code, launched = _launch(
        "--hostfile",
        str(hostfile),
        "--ssh-config",
        str(box.ssh_config),
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert code == 0 and "all 4 rank(s) on 2 node(s) finished" in launched, launched


def _problems(doc: dict) -> list[str]:
    return [f["id"] for f in doc["findings"] if f["severity"] != "info"]


def _with_workdir(cluster_file: Path, tmp_path: Path, workdir: Path) -> Path:
    doc = yaml.safe_load(cluster_file.read_text())
    doc["workdir"] = str(workdir)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_sync_makes_code_differs_go_away_on_nodes_without_shared_storage(
    make_box, tmp_path, capsys, monkeypatch
):
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    box = make_box(5, nodes=3, node_local_dir=str(work))
    (work / "train.py").write_text("print('v2')\n")
    (work / "pkg" / "model.py").write_text("LAYERS = 2\n")
    local = {n.hostname: box.state_dir / "nodes" / n.hostname / "local" for n in box.nodes}
    for host in ("gpu-node-1", "gpu-node-2"):
        shutil.copytree(work, local[host], dirs_exist_ok=True)
    (local["gpu-node-3"] / "train.py").write_text("print('v1')\n")  # an older copy
    (local["gpu-node-3"] / "removed_since.py").write_text("x\n")
    (local["gpu-node-3"] / "outputs").mkdir()
    (local["gpu-node-3"] / "outputs" / "ckpt.json").write_text("{}\n")  # never touched
    cluster_file = _with_workdir(box.cluster_file, tmp_path, work)
    before = run_doctor(load_cluster(cluster_file=str(cluster_file)))
    assert {h for f in before.findings if f.id == "code-differs" for h in f.nodes} == {"gpu-node-3"}
    argv = ["sync", "-c", str(cluster_file), str(work), "--yes", "--json"]

    code, out, _ = _run([*argv, "--method", "tar"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and _problems(doc) == [], doc
    assert _changes(doc) == {"gpu-node-3": [f"copied {work} (tar)"]}
    assert [f["id"] for f in doc["findings"]] == ["shared-dir-missing"]  # info: why sync copies
    files = sorted(str(p.relative_to(local["gpu-node-3"])) for p in local["gpu-node-3"].rglob("*"))
    assert files == ["outputs", "outputs/ckpt.json", "pkg", "pkg/model.py", "train.py"]
    if shutil.which("rsync"):
        (local["gpu-node-2"] / "train.py").write_text("print('v0')\n")
        code, out, _ = _run([*argv, "--method", "rsync"], capsys, monkeypatch)
        doc = json.loads(out)
        assert code == 0 and _problems(doc) == [], doc
        assert _changes(doc) == {"gpu-node-2": [f"copied {work} (rsync)"]}

    code, out, _ = _run(argv[:-1], capsys, monkeypatch)

    assert code == 0 and out.startswith("trainfleet sync: nothing changed"), out


HJSON = metadata.version("hjson")
"""A small package of the training stack (DeepSpeed needs it), at this machine's version."""


@pytest.fixture
def node_local_dir():
    """A directory each node sees as its own (the sandbox mounts a private copy over it), on a
    path the password sandbox's user can reach (pytest's tmp_path is root's alone)."""
    made = Path(tempfile.mkdtemp(prefix="tf-node-local-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _old_hjson_wheel(directory: Path) -> Path:
    """A real wheel of hjson at a version this machine does not have (0.0.1): what a node
    installed long ago."""
    info = "hjson-0.0.1.dist-info"
    files = {
        "hjson/__init__.py": b"__version__ = '0.0.1'\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: hjson\nVersion: 0.0.1\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},{wheels.record_hash(data)},{len(data)}" for name, data in files.items()]
    path = directory / "hjson-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]))
    path.chmod(0o644)
    return path


def test_setup_with_no_step_takes_bare_servers_to_a_first_training_step_and_again_changes_nothing(
    make_box, node_local_dir, tmp_path, capsys, monkeypatch
):
    """Fresh servers (#21): only a password gets in, the nodes' python has no torch, each node
    has its own disk and no shared code, the master's firewall drops NCCL's ports. A node whose
    disk the user cannot write stops `setup` before anything is installed anywhere. Then one
    `trainfleet setup --yes` trusts ssh, records the nodes, installs this machine's training
    environment on each node (no index there), builds DeepSpeed's ops on one node and copies
    them to the other, opens the firewall with the user's sudo rights, copies the code and
    ends with a clean full doctor; `trainfleet train` reaches its first step with nothing
    compiled at launch; the same setup again changes nothing, and a node with one package at
    another version gets this machine's."""
    project = node_local_dir / "project"
    demo_assets.write_tokenizer(project / "model")
    demo_assets.write_model(project / "model", tokenizer_dir=project / "model", seed=0)
    demo_assets.write_dataset(project / "data.jsonl", n=48)
    venv = node_local_dir / "venv"
    box = make_box(6, nodes=2, auth="password", faults=["firewall-blocks-ports@1"],
                   node_local_dir=str(node_local_dir))  # fmt: skip
    cluster_file = tmp_path / "cluster.yaml"
    spec = yaml.safe_load(box.cluster_file.read_text())
    cluster_file.write_text(yaml.safe_dump({**spec, "python": "/usr/bin/python3"}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the packed wheels
    # setup gives the nodes' op builds the launch shell's TORCH_EXTENSIONS_DIR, as a launch
    # gives it to the ranks: a developer's own (root's, on this machine) is no bare server's.
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    argv = ["setup", "-c", str(cluster_file), "--venv", str(venv), "--code", str(project),
            "--slots", "1", "--yes"]  # fmt: skip
    password = box.password_file.read_text()
    disks = {h: box.state_dir / "nodes" / h / "local" for h in ("gpu-node-1", "gpu-node-2")}
    disks["gpu-node-2"].chmod(0o555)  # the user may not write there

    code, out, err = _run([*argv, "--password-stdin", "--json"], capsys, monkeypatch, password)

    doc = json.loads(out)
    assert code == 1 and doc["stopped"]["step"] == "pyenv", (doc, err[-3000:])
    assert doc["stopped"]["error"] == (
        "nothing was installed anywhere: gpu-node-2 cannot take the environment: cannot write "
        "there (permissions)"
    )
    assert not (disks["gpu-node-1"] / venv.name).exists()  # not half-installed
    disks["gpu-node-2"].chmod(0o755)

    code, out, err = _run([*argv, "--json"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and doc["stopped"] is None, (doc, err[-3000:])
    steps = {s["step"]: s for s in doc["steps"]}
    assert list(steps) == ["ssh", "hostfile", "env", "pyenv", "firewall", "hosts", "sync"]
    assert all(s["seconds"] > 0 for s in steps.values()), steps
    installed = _changes(steps["pyenv"])
    ops = "fused_adam, deepspeed_shm_comm"
    for host in ("gpu-node-1", "gpu-node-2"):
        assert any(c.startswith(f"created {venv} (/usr/bin/python3") for c in installed[host])
        assert f"python: {venv}/bin/python, PATH: {venv}/bin:" in installed[host][-1]
    assert re.fullmatch(r"built DeepSpeed ops fused_adam \(\d+ s\), deepspeed_shm_comm \(\d+ s\)",
                        installed["gpu-node-1"][1]), installed  # fmt: skip
    assert installed["gpu-node-2"][1] == f"DeepSpeed ops {ops}: copied from gpu-node-1"
    assert list(_changes(steps["firewall"])) == ["gpu-node-1"]
    assert _changes(steps["hosts"]) == {}  # the sandbox's /etc/hosts names the mapped addresses
    assert sorted(_changes(steps["sync"])) == ["gpu-node-1", "gpu-node-2"]
    report = doc["doctor"]
    assert report["exit_code"] == 0 and "collective" in report["phases"], report
    assert [f["id"] for f in report["findings"] if f["severity"] != "info"] == [], report
    torch_here = metadata.version("torch")
    for host in ("gpu-node-1", "gpu-node-2"):  # the all_reduce ran on the nodes' new torch
        node = report["nodes"][host]
        assert (node["python"], node["versions"]["torch"]) == (f"{venv}/bin/python", torch_here)
    assert not venv.exists()  # this machine's own view: the nodes' disks got it, not this one

    # Train's output is the one directory every node shares; its ranks run as the test user.
    shared = Path(tempfile.mkdtemp(prefix="tf-train-out-"))
    owner = (box.state_dir / "nodes" / "gpu-node-1" / "home").stat()
    os.chown(shared, owner.st_uid, owner.st_gid)
    train = [sys.executable, "-m", "trainfleet", "train", "-c", str(cluster_file),
             "--model", str(project / "model"), "--data", str(project / "data.jsonl"),
             "--output", str(shared / "out"), "--max-steps", "1", "--seq-len", "64",
             "--no-export"]  # fmt: skip
    try:
        done = subprocess.run(train, capture_output=True, text=True, timeout=400, umask=0)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "step 1/1" in said, said[-4000:]
    assert "Building extension module" not in said and "ninja" not in said, said[-4000:]

    code, out, err = _run(argv, capsys, monkeypatch)

    assert code == 0 and out.rstrip().endswith("trainfleet setup: nothing changed"), out
    assert "doctor (full" in out and "no problems found" in out, out

    # One package at another version on one node (installed there by pip): that node gets
    # this machine's version of it, nothing else changes anywhere.
    old = _old_hjson_wheel(disks["gpu-node-2"])
    pip = [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           f"{node_local_dir}/{old.name}"]  # fmt: skip
    assert main(["exec", "-c", str(cluster_file), "-i", "gpu-node-2", "--", *pip]) == 0
    site = sorted(disks["gpu-node-2"].glob(f"{venv.name}/lib/python3*/site-packages"))[0]
    assert [p.name for p in site.glob("hjson-*.dist-info")] == ["hjson-0.0.1.dist-info"]
    pyenv = ["setup", "pyenv", "-c", str(cluster_file), "--venv", str(venv), "--yes", "--json"]

    code, out, err = _run(pyenv, capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and doc["findings"] == [], (doc, err[-2000:])
    assert _changes(doc) == {"gpu-node-2": [f"installed 1 package(s): hjson {HJSON}"]}, doc
    assert [p.name for p in site.glob("hjson-*.dist-info")] == [f"hjson-{HJSON}.dist-info"]


def _etc_hosts(box: sandbox.Sandbox) -> dict[int, str]:
    return {i: Path(f"/etc/netns/{box.node(i).netns}/hosts").read_text() for i in (1, 2)}


def test_setup_hosts_where_dns_never_answers_and_revert_restores_etc_hosts_exactly(
    make_box, tmp_path, capsys, monkeypatch
):
    """Both nodes' resolver takes queries and never answers (`dns-unreachable`: glibc's 5 s x 2
    tries), as on air-gapped clusters. doctor warns with the seconds a launch loses, and a
    launch's plan says so and sets RES_OPTIONS for its processes (1 s per lookup); `setup
    hosts` adds a line per missing name (the master: every node's, its own included; the other
    node: the master's), recorded; then no warning, a launch prints no `err=-3` and a second
    run changes nothing; --revert restores both nodes' /etc/hosts byte for byte."""
    box = make_box(7, nodes=2, faults=["dns-unreachable@1", "dns-unreachable@2"])
    cluster_file = tmp_path / "cluster.yaml"
    shutil.copy(box.cluster_file, cluster_file)
    original = _etc_hosts(box)
    report = run_doctor(load_cluster(cluster_file=str(cluster_file)), quick=True)
    (warning,) = [f for f in report.findings if f.id.value == "hostname-unresolvable"]
    assert "err=-3" in "\n".join(warning.evidence), warning
    assert set(warning.nodes) == {"gpu-node-1", "gpu-node-2"}, warning
    assert "about 20 s more to start" in "\n".join(warning.evidence), warning
    code, planned = _launch("-c", str(cluster_file), "--dry-run")
    # without /etc/hosts lines, launch shortens each lookup that gets no answer to glibc's 1 s
    assert code == 0 and "this launch about 2 s more to start" in planned, planned
    assert "RES_OPTIONS=timeout:1 attempts:1 set for its processes" in planned, planned
    each = "RES_OPTIONS='timeout:1 attempts:1'  # the node's resolver does not answer"
    assert planned.count(each) == 2, planned
    argv = ["setup", "hosts", "-c", str(cluster_file)]

    code, out, _ = _run([*argv, "--yes", "--json"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and doc["findings"] == [], doc
    one, two = box.node(1).address, box.node(2).address
    assert _changes(doc) == {
        "gpu-node-1": [  # its own too: the master's own ranks connect to its store
            f"added to /etc/hosts: ::ffff:{one} gpu-node-1-ipv4-mapped",
            f"added to /etc/hosts: ::ffff:{two} gpu-node-2-ipv4-mapped",
        ],
        "gpu-node-2": [f"added to /etc/hosts: ::ffff:{one} gpu-node-1-ipv4-mapped"],
    }
    assert sorted(json.loads((tmp_path / "cluster.yaml.hosts.json").read_text())["nodes"]) == [
        "gpu-node-1", "gpu-node-2"]  # fmt: skip
    code, launched = _launch("-c", str(cluster_file), "--run-dir", str(tmp_path / "run"))
    assert code == 0 and "all 2 rank(s) on 2 node(s) finished" in launched, launched
    assert "err=-3" not in launched and "setup hosts" not in launched, launched
    code, out, _ = _run(argv + ["--yes"], capsys, monkeypatch)
    assert code == 0 and out.startswith("trainfleet setup hosts: nothing changed"), out

    code, out, _ = _run([*argv, "--revert", "--json"], capsys, monkeypatch)

    doc = json.loads(out)
    assert code == 0 and sorted(_changes(doc)) == ["gpu-node-1", "gpu-node-2"], doc
    assert _etc_hosts(box) == original
    assert not (tmp_path / "cluster.yaml.hosts.json").exists()
    assert [f["id"] for f in doc["findings"]] == ["hostname-unresolvable"]  # back, as before
