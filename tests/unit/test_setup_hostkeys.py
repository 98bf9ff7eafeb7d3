"""setup ssh's host key decisions: every name a node is reached by, new vs known vs changed,
and what the confirmation shows (pure functions; ssh-keygen only for the file lookups)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from trainfleet.cluster import Cluster, Node, SshOptions
from trainfleet.errors import SetupError
from trainfleet.keyscan import fingerprint
from trainfleet.node import answer as answer_mark
from trainfleet.node import sshkeys
from trainfleet.setup.result import SetupResult
from trainfleet.setup.trust import hostkeys, keyjobs
from trainfleet.setup.trust.hostkeys import Target, known_hosts_names, plan_names
from trainfleet.setup.trust.this_machine import question, this_machine

pytestmark = pytest.mark.unit

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFol2UvIazLX/8FAnaR4NxMQs2aW4irjM1pE/uTTkDhM"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICn6fxmxLQuKd20BsR8GCBByLcd3+WHtcWT3d/Oj9bCK"
ECDSA = (
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBMJG4pnFZGCbicqixwp0"
    "84ojclffNpiCZpubFBKrYPoAuICVIxIM1rrSrel+lruRpLtZN6n9ukt9KN33jY4jDzhtrSGuGEX3FLtAdKq6HJ8w/CU9"
    "E2a/oFNklrSu8BjJQQ=="
)


def test_every_name_a_node_is_reached_by_gets_a_line():
    names = known_hosts_names(
        "gpu-node-2",
        hostname="10.0.0.12",
        address="10.0.0.12",
        port=22,
        machine_hostname="node2.cluster.local",
    )
    assert names == ["gpu-node-2", "10.0.0.12", "node2.cluster.local"]
    lines = hostkeys.known_hosts_lines(names, [NEW])
    assert lines == [f"{name} {NEW}" for name in names]


@pytest.mark.parametrize(
    "reported",
    ["*", "*.cluster.local", "gpu-node-?", "!gpu-node-1", "a,b", "x\n@cert-authority *",
     "fe80::1%eth0 *", "node\n", "", "[gpu-node-1]:22", "#node", "a" * 64],
)  # fmt: skip
def test_a_hostname_a_node_reports_becomes_a_name_only_when_it_is_plain(reported):
    """Root on a node sets its hostname: `*` would trust the node's key for every host, a
    newline and `@cert-authority` would plant a CA for every host."""
    names = known_hosts_names(
        "gpu-node-2", hostname="10.0.0.12", address="10.0.0.12", port=22, machine_hostname=reported
    )
    assert names == ["gpu-node-2", "10.0.0.12"]
    if not reported.startswith("["):  # `[name]:port` is how a line writes another port
        with pytest.raises(ValueError, match="not a known_hosts name"):
            hostkeys.known_hosts_lines([*names, reported or "*"], [NEW])


def test_a_key_that_is_not_type_and_base64_is_never_a_line():
    for key in ("@cert-authority * " + NEW, NEW + "\n* " + NEW, "ssh-ed25519", "ssh-ed25519 a b"):
        with pytest.raises(ValueError, match="not a known_hosts name or key"):
            hostkeys.known_hosts_lines(["gpu-node-2"], [key])


def test_ssh_error_text_from_a_probe_names_only_a_plain_host():
    from trainfleet.keyscan import unknown_key_name

    said = "No ED25519 host key is known for {} and you have requested strict checking."
    assert unknown_key_name(said.format("gpu-node-2")) == "gpu-node-2"
    assert unknown_key_name(said.format("[10.0.0.12]:2222")) == "[10.0.0.12]:2222"
    assert unknown_key_name(said.format("*")) is None
    assert unknown_key_name(said.format("[*]:22")) is None


def test_a_config_hostname_its_address_and_a_host_key_alias_are_all_names():
    names = known_hosts_names(
        "trainer2", hostname="node2.lan", address="192.168.1.12", port=22, hostkey_alias="n2"
    )
    assert names == ["n2", "trainer2", "node2.lan", "192.168.1.12"]


def test_another_port_is_written_as_ssh_looks_it_up():
    names = known_hosts_names("gpu-node-1", hostname="10.0.0.11", address="10.0.0.11", port=2222)
    assert names == ["[gpu-node-1]:2222", "[10.0.0.11]:2222"]


def test_plan_adds_only_missing_lines_and_flags_a_changed_key():
    names = ["gpu-node-2", "10.0.0.12"]
    add, stale = plan_names(names, [NEW], {"gpu-node-2": [NEW]})
    assert (add, stale) == ([f"10.0.0.12 {NEW}"], {})
    add, stale = plan_names(names, [NEW], {"gpu-node-2": [NEW], "10.0.0.12": [NEW]})
    assert (add, stale) == ([], {})  # a second run changes nothing
    add, stale = plan_names(names, [NEW], {"gpu-node-2": [OLD]})
    assert stale == {"gpu-node-2": [OLD]}
    assert add == [f"gpu-node-2 {NEW}", f"10.0.0.12 {NEW}"]


def test_a_name_whose_known_keys_are_none_of_the_offered_ones_changed_whatever_their_type():
    """A man in the middle offering only an ECDSA key where an Ed25519 one is known: OpenSSH
    says REMOTE HOST IDENTIFICATION HAS CHANGED, and so does setup (--yes never takes it)."""
    add, stale = plan_names(["gpu-node-2"], [ECDSA], {"gpu-node-2": [NEW]})
    assert stale == {"gpu-node-2": [NEW]} and add == [f"gpu-node-2 {ECDSA}"]
    # One known key still offered: it is the node known; its other key is new, not a change.
    add, stale = plan_names(["gpu-node-2"], [NEW, ECDSA], {"gpu-node-2": [NEW]})
    assert stale == {} and add == [f"gpu-node-2 {ECDSA}"]


def test_the_confirmation_lists_every_name_each_key_goes_under():
    target = Target(node="gpu-node-2", hostname="10.0.0.12", port=22, address="10.0.0.12")
    target.offered = [NEW]
    target.machine_hostname = "node2.lan"
    add, _ = plan_names(target.names, target.offered, {})
    assert question(hostkeys.describe_new(target, add, {}), []).splitlines()[1:] == [
        f"  gpu-node-2 (10.0.0.12): {fingerprint(NEW)}",
        "      as gpu-node-2, 10.0.0.12, node2.lan",
        "trust these keys?",
    ]
    # A key trusted already, under a name it did not have: a question that says so.
    known = {"gpu-node-2": [NEW], "10.0.0.12": [NEW]}
    add, _ = plan_names(target.names, target.offered, known)
    assert hostkeys.describe_new(target, add, known) == [
        f"  gpu-node-2 (10.0.0.12): {fingerprint(NEW)} (trusted already as gpu-node-2, 10.0.0.12)",
        "      as node2.lan",
    ]


def test_the_confirmation_shows_old_and_new_fingerprints():
    target = Target(node="gpu-node-2", hostname="10.0.0.12", port=22, address="10.0.0.12")
    target.offered = [NEW]
    lines = hostkeys.describe_changed("this machine", target, {"gpu-node-2": [OLD], "x": [OLD]})
    text = question([], lines)
    assert "gpu-node-2 (known as gpu-node-2, x): CHANGED" in text
    assert f"was: {fingerprint(OLD)}" in text and f"now: {fingerprint(NEW)}" in text
    assert text.endswith("replace the old keys and trust the new ones?")


def test_a_line_of_the_users_known_hosts_that_is_no_key_is_shown_as_such():
    assert fingerprint("ssh-ed25519 A" + "A" * 40).endswith("(not a valid public key)")


def _targets() -> dict[str, Target]:
    return {
        f"gpu-node-{i}": Target(
            node=f"gpu-node-{i}", hostname=f"10.0.0.1{i}", port=22, address=f"10.0.0.1{i}"
        )
        for i in (1, 2, 3)
    }


@pytest.mark.parametrize(
    ("reported", "resolves_to", "refused"),
    [
        ("gpu-node-2", set(), None),  # a name it has already
        ("node2.lan", {"10.0.0.12"}, None),  # resolves here to its own address
        ("NODE2.lan", {"10.0.0.12"}, None),
        ("github.com", {"140.82.121.4"}, "resolves here to 140.82.121.4, not to its address"),
        ("node2.lan", set(), "resolves here to nothing, not to its address 10.0.0.12"),
        ("node2.lan", {"10.0.0.12", "10.0.0.13"}, "resolves here to 10.0.0.12, 10.0.0.13"),
        ("gpu-node-1", {"10.0.0.12"}, "is a name of gpu-node-1"),  # a peer's, whatever DNS says
        ("GPU-NODE-1", {"10.0.0.12"}, "is a name of gpu-node-1"),
        ("10.0.0.13", {"10.0.0.13"}, "is a name of gpu-node-3"),
        ("launch-host", {"10.0.0.12"}, "is a name of this machine"),
        ("localhost", {"127.0.0.1"}, "is a name of this machine"),
        ("127.0.0.2", {"127.0.0.2"}, "is a name of this machine"),
        ("*", {"10.0.0.12"}, "is not a host name"),
    ],
)
def test_a_nodes_own_hostname_names_its_key_only_where_it_resolves_here_to_that_node(
    reported, resolves_to, refused
):
    targets = _targets()
    others = [t for name, t in targets.items() if name != "gpu-node-2"]
    why = hostkeys.own_hostname_refused(
        reported,
        targets["gpu-node-2"],
        others,
        this_machine={"launch-host"},
        resolve=lambda name: resolves_to,
    )
    assert why is None if refused is None else refused in (why or ""), why


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_given_known_hosts_file_vouches_for_a_key_only_under_the_names_it_lists(tmp_path):
    given = tmp_path / "known_hosts"
    given.write_text(f"10.0.0.12 {OLD}\ngpu-node-2 {NEW}\n")
    lines = [f"gpu-node-2 {NEW}", f"10.0.0.12 {NEW}", f"gpu-node-1 {NEW}"]
    assert hostkeys.vouched(str(given), lines) == {f"gpu-node-2 {NEW}"}
    # hashed entries (HashKnownHosts yes) count too
    subprocess.run(["ssh-keygen", "-H", "-f", str(given)], capture_output=True, check=True)
    assert "gpu-node-2" not in given.read_text()
    assert hostkeys.vouched(str(given), lines) == {f"gpu-node-2 {NEW}"}


def _one_node_cluster(tmp_path, known: str) -> Cluster:
    (tmp_path / "known_hosts").write_text(known)
    ssh = SshOptions(
        known_hosts_file=str(tmp_path / "known_hosts"), identity_file=str(tmp_path / "id")
    )
    node = Node(host="gpu-node-2", slots=1, gpu_ids=(0,), python="python3", ssh=ssh)
    return Cluster(nodes=(node,), master="gpu-node-2")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_given_known_hosts_file_never_vouches_for_a_key_under_another_nodes_name(tmp_path):
    """With --known-hosts FILE holding every node's real key, a node that called itself
    gpu-node-1 had gpu-node-1's real key replaced by its own, with no question (review F1)."""
    cluster = _one_node_cluster(tmp_path, f"gpu-node-1 {OLD}\n")
    given = tmp_path / "given"
    given.write_text(f"gpu-node-1 {OLD}\ngpu-node-2 {NEW}\n")
    target = Target(node="gpu-node-2", hostname="gpu-node-2", port=22, address=None)
    target.offered, target.machine_hostname = [NEW], "gpu-node-1"  # past own_hostname_refused
    asked: list[tuple[str, bool]] = []

    def confirm(text: str, changed_keys: bool = False) -> bool:
        asked.append((text, changed_keys))
        return False

    with pytest.raises(SetupError, match="changed host keys were not confirmed"):
        this_machine(cluster, {"gpu-node-2": target}, SetupResult(step="ssh"), confirm, str(given))
    assert (tmp_path / "known_hosts").read_text() == f"gpu-node-1 {OLD}\n"
    ((text, changed_keys),) = asked
    assert changed_keys and "gpu-node-2 (known as gpu-node-1): CHANGED" in text
    assert "as gpu-node-2" not in text  # the file vouches for that one: not asked


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_trusted_key_under_a_new_name_is_a_question(tmp_path):
    cluster = _one_node_cluster(tmp_path, f"gpu-node-2 {NEW}\n")
    target = Target(node="gpu-node-2", hostname="gpu-node-2", port=22, address=None)
    target.offered, target.machine_hostname = [NEW], "node2.lan"
    asked: list[str] = []

    def confirm(text: str, changed_keys: bool = False) -> bool:
        asked.append(text)
        return not changed_keys

    this_machine(cluster, {"gpu-node-2": target}, SetupResult(step="ssh"), confirm, None)
    assert f"{fingerprint(NEW)} (trusted already as gpu-node-2)\n      as node2.lan" in asked[0]
    assert (tmp_path / "known_hosts").read_text() == f"gpu-node-2 {NEW}\nnode2.lan {NEW}\n"


def _answer(**fields) -> str:
    answer = {
        "hostname": "gpu-node-2", "uid": 0, "identity": "/root/.ssh/id_ed25519",
        "key_created": False, "known_hosts": "/root/.ssh/known_hosts",
        "authorized_keys": "/root/.ssh/authorized_keys", "pubkey": NEW, "key_missing": False,
        "known": {"gpu-node-1": [OLD]}, "removed": [], "known_added": 0, "authorized_added": 0,
    }  # fmt: skip
    return "some login noise\n" + answer_mark.MARK + json.dumps(answer | fields) + "\n"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"pubkey": f'{NEW}\ncert-authority,principals="root" {OLD}'}, "not exactly one key"),
        ({"pubkey": "ssh-ed25519 " + "A" * 68}, "not exactly one key"),
        ({"known": {"gpu-node-1": ["ssh-ed25519 A"]}}, "known keys for gpu-node-1 that are not"),
        ({"known": {"github.com": [OLD]}}, "exactly the names asked for"),
        ({"removed": ["gpu-node-1"]}, "removed names it was not asked to remove"),
        ({"known_hosts": "/root/.ssh/kh\x1b]0;owned\x07"}, "no plain known_hosts"),
        ({"known_added": "3"}, "counts"),
    ],
)
def test_a_nodes_answer_to_the_trust_job_is_checked_before_anything_is_written(fields, said):
    """A public key with a newline put a cert-authority line into every node's
    authorized_keys; a known key that is not base64 crashed setup ssh (review F5, F13)."""
    job = sshkeys.job(lookup=["gpu-node-1"])
    assert keyjobs.read_answer("gpu-node-2", _answer(), job)["pubkey"] == NEW
    with pytest.raises(SetupError, match=f"gpu-node-2: the setup job's answer .*{said}"):
        keyjobs.read_answer("gpu-node-2", _answer(**fields), job)
    missing = "gpu-node-2: the setup job's answer is missing or malformed .it printed no answer"
    with pytest.raises(SetupError, match=missing):
        keyjobs.read_answer("gpu-node-2", "Traceback ...\n", job)
