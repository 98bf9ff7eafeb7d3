"""The password-only sandbox's files: what fresh servers look like before `setup ssh`."""

from __future__ import annotations

import pytest
import yaml

from trainfleet.cluster import parse_cluster_yaml
from trainfleet.sandbox import build, texts, users

pytestmark = pytest.mark.unit


def test_sshd_accepts_only_the_users_password_and_its_own_keys(tmp_path):
    node = build.plan_nodes("x", 1, [], "10.9.9.0/24")[0]
    text = texts.sshd_config_text(node, tmp_path, trust=True, password_user="tfuser")
    assert "PasswordAuthentication yes" in text and "AllowUsers tfuser" in text
    assert "PermitRootLogin no" in text
    assert "AuthorizedKeysFile .ssh/authorized_keys" in text
    assert str(tmp_path / "authorized_keys") not in text  # the sandbox's own key: not trusted
    default = texts.sshd_config_text(node, tmp_path, trust=True)
    assert "PasswordAuthentication no" in default and "AllowUsers" not in default


def test_the_password_clusters_ssh_files_live_in_the_users_home(tmp_path):
    nodes = build.plan_nodes("x", 2, [], "10.9.9.0/24")
    text = texts.cluster_yaml_text(nodes, tmp_path, 1, 29500, password_user="tfuser")
    cluster = parse_cluster_yaml(text, str(tmp_path / "cluster.yaml"))
    ssh = cluster.nodes[0].ssh
    assert ssh.user == "tfuser"
    assert ssh.identity_file == str(tmp_path / "home" / ".ssh" / "id_ed25519")
    assert ssh.known_hosts_file == str(tmp_path / "home" / ".ssh" / "known_hosts")
    assert cluster.nodes[0].python == "python3" and cluster.workdir == str(tmp_path / "home")
    config = texts.password_ssh_config_text(nodes, "tfuser")
    assert f"HostName {nodes[1].address}" in config and "User tfuser" in config
    assert "IdentityFile" not in config  # nothing trusted, no key given
    default = yaml.safe_load(texts.cluster_yaml_text(nodes, tmp_path, 1, 29500))
    assert default["ssh"]["identity_file"] == str(tmp_path / "id_ed25519")


def test_user_lines():
    user = users.SandboxUser(uid=4300, gid=100, home="/run/h", login_shell="/bin/bash")
    assert users.passwd_line(user) == "tfuser:x:4300:100:trainfleet sandbox user:/run/h:/bin/bash"
    line = users.shadow_line(user, "$6$salt$hash", 20000)
    assert line == "tfuser:$6$salt$hash:20000:0:99999:7:::"  # last change not 0: no forced change
    assert users.with_line("a\nb", "c") == "a\nb\nc\n"
    assert users.free_uid("x:x:4200:1::/:/bin/sh\ny:x:4201:1::/:/bin/sh\n") == 4202


def test_unknown_auth_mode_is_refused():
    with pytest.raises(Exception, match="unknown auth"):
        build.up(nodes=1, auth="kerberos")
