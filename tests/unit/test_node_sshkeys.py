"""The job setup ssh runs on every node (and here): run locally against a temporary HOME."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from trainfleet import node
from trainfleet.node import sshkeys

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen"),
]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFol2UvIazLX/8FAnaR4NxMQs2aW4irjM1pE/uTTkDhM"
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICn6fxmxLQuKd20BsR8GCBByLcd3+WHtcWT3d/Oj9bCK"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_identity_choice():
    exists = {"/h/.ssh/id_rsa"}.__contains__
    assert sshkeys.pick_identity("/keys/k", [], exists) == ("/keys/k", True)
    assert sshkeys.pick_identity(None, ["~/.ssh/id_rsa"], exists)[1] is True  # only defaults
    custom = ["/etc/ssh/cluster_key", *(f"~/.ssh/{n}" for n in sshkeys.DEFAULT_IDENTITIES)]
    assert sshkeys.pick_identity(None, custom, lambda p: True) == ("/etc/ssh/cluster_key", False)


def test_key_is_created_once_and_dry_run_creates_nothing(home):
    assert sshkeys.main(sshkeys.job(make_key=True, dry_run=True))["key_missing"] is True
    assert not (home / ".ssh").exists()
    made = sshkeys.main(sshkeys.job(make_key=True))
    assert made["key_created"] and made["identity"] == str(home / ".ssh" / "id_ed25519")
    assert made["pubkey"].startswith("ssh-ed25519 ")
    again = sshkeys.main(sshkeys.job(make_key=True))
    assert not again["key_created"] and again["pubkey"] == made["pubkey"]


def test_known_hosts_lines_are_added_once_and_changed_names_replaced(home):
    path = home / ".ssh" / "known_hosts"
    lines = [f"gpu-node-1 {KEY}", f"10.0.0.11 {KEY}"]
    assert sshkeys.main(sshkeys.job(add_known=lines))["known_added"] == 2
    assert sshkeys.main(sshkeys.job(add_known=lines))["known_added"] == 0
    assert (path.stat().st_mode & 0o777) == 0o600
    assert sshkeys.main(sshkeys.job(lookup=["gpu-node-1", "gpu-node-9"]))["known"] == {
        "gpu-node-1": [KEY],
        "gpu-node-9": [],
    }
    done = sshkeys.main(sshkeys.job(remove=["gpu-node-1"], add_known=[f"gpu-node-1 {OTHER}"]))
    assert done["removed"] == ["gpu-node-1"] and done["known_added"] == 1
    assert path.read_text().splitlines() == [f"10.0.0.11 {KEY}", f"gpu-node-1 {OTHER}"]


def test_authorized_keys_compare_keys_not_comments_or_options(home):
    auth = home / ".ssh" / "authorized_keys"
    auth.parent.mkdir()
    auth.write_text(f'from="10.0.0.0/8" {KEY} someone@laptop')  # no trailing newline
    done = sshkeys.main(
        sshkeys.job(authorize=[f"{KEY} trainfleet-setup:x", f"{OTHER} trainfleet-setup:y"])
    )
    assert done["authorized_added"] == 1
    assert auth.read_text().splitlines() == [
        f'from="10.0.0.0/8" {KEY} someone@laptop',
        f"{OTHER} trainfleet-setup:y",
    ]
    assert sshkeys.main(sshkeys.job(authorize=[OTHER]))["authorized_added"] == 0


def test_the_payload_runs_on_a_plain_python3(home):
    job = sshkeys.job(add_known=[f"gpu-node-1 {KEY}"], dry_run=True)
    out = subprocess.run(
        node.argv(sys.executable, sshkeys),
        input=node.line(sshkeys.run, job),
        capture_output=True,
        check=True,
    )
    result = node.read_answer(out.stdout.decode(), sshkeys.TrustAnswer, node="here")
    assert result["known_added"] == 1 and not (home / ".ssh" / "known_hosts").exists()


def test_ssh_g_names_the_files_ssh_uses(home):
    text = "hostname 10.0.0.2\nport 2222\nidentityfile ~/.ssh/id_rsa\nuserknownhostsfile /k /k2\n"
    parsed = sshkeys.parse_ssh_g(text)
    assert parsed["hostname"] == "10.0.0.2" and parsed["port"] == "2222"
    assert parsed["userknownhostsfile"] == ["/k", "/k2"]
    argv = ["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={home}/kh", "-G", "--", "h"]
    assert sshkeys.main(sshkeys.job(ssh_g=argv))["known_hosts"] == f"{home}/kh"
