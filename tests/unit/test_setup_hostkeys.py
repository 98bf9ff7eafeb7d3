"""setup ssh's host key decisions: every name a node is reached by, new vs known vs changed,
and what the confirmation shows (pure functions; ssh-keygen only for the file lookups)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from trainfleet.setup import hostkeys
from trainfleet.setup.hostkeys import Target, known_hosts_names, plan_names
from trainfleet.setup.launchside import question
from trainfleet.sshkeys import fingerprint

pytestmark = pytest.mark.unit

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFol2UvIazLX/8FAnaR4NxMQs2aW4irjM1pE/uTTkDhM"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICn6fxmxLQuKd20BsR8GCBByLcd3+WHtcWT3d/Oj9bCK"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDeadbeefdeadbeefdeadbeefdeadbeefdeadbeef"


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
    from trainfleet.doctor.fix import unknown_key_name

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


def test_a_known_key_of_another_type_is_not_a_change():
    add, stale = plan_names(["gpu-node-2"], [NEW], {"gpu-node-2": [RSA]})
    assert stale == {} and add == [f"gpu-node-2 {NEW}"]


def test_only_keys_no_name_knows_need_the_users_yes():
    target = Target(node="gpu-node-2", hostname="10.0.0.12", port=22, address="10.0.0.12")
    target.offered = [NEW]
    assert hostkeys.new_keys(target, {}) == [NEW]
    assert hostkeys.new_keys(target, {"10.0.0.12": [NEW]}) == []  # known: more names, no ask


def test_the_confirmation_shows_old_and_new_fingerprints():
    target = Target(node="gpu-node-2", hostname="10.0.0.12", port=22, address="10.0.0.12")
    target.offered = [NEW]
    lines = hostkeys.describe_changed("this machine", target, {"gpu-node-2": [OLD], "x": [OLD]})
    text = question([], lines)
    assert "gpu-node-2 (known as gpu-node-2, x): CHANGED" in text
    assert f"was: {fingerprint(OLD)}" in text and f"now: {fingerprint(NEW)}" in text
    assert text.endswith("replace the old keys and trust the new ones?")
    assert question(hostkeys.describe_new(target, [NEW]), []).endswith("trust these keys?")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_given_known_hosts_file_vouches_for_the_offered_keys(tmp_path):
    target = Target(node="gpu-node-2", hostname="10.0.0.12", port=22, address="10.0.0.12")
    target.offered = [NEW]
    given = tmp_path / "known_hosts"
    given.write_text(f"10.0.0.12 {OLD}\n")
    assert not hostkeys.trusted_by_file(str(given), target)
    given.write_text(f"gpu-node-2 {NEW}\n")
    assert hostkeys.trusted_by_file(str(given), target)
    # hashed entries (HashKnownHosts yes) count too
    subprocess.run(["ssh-keygen", "-H", "-f", str(given)], capture_output=True, check=True)
    assert "gpu-node-2" not in given.read_text()
    assert hostkeys.trusted_by_file(str(given), target)
