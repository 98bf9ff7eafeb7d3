"""cluster.yaml, --hosts and the default local cluster: one model, errors that name the line."""

from __future__ import annotations

import sys
import textwrap

import pytest

from trainfleet.cluster import DEFAULT_MASTER_PORT, load_cluster, parse_cluster_yaml
from trainfleet.errors import SpecError

pytestmark = pytest.mark.unit

FULL = """\
master: gpu-node-2
master_port: 29600
workdir: /data/project
env: {HF_HOME: /data/hf, NCCL_DEBUG: WARN}
ssh:
  user: root
  port: 2222
  identity_file: keys/id_ed25519
  options: ["-o", "Compression=yes"]
nodes:
  - host: gpu-node-1
    slots: 8
    interface: ens14f0
  - host: gpu-node-2
    slots: 4
    python: /opt/conda/envs/train/bin/python
    env: {NCCL_DEBUG: INFO, NCCL_IB_HCA: mlx5}
    ssh: {user: trainer, options: ["-o", "Compression=no"], known_hosts_file: kh}
  - 10.0.0.3
"""


def _write(tmp_path, text: str, name: str = "cluster.yaml"):
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    path = conf / name
    path.write_text(textwrap.dedent(text))
    return path


def test_full_example(tmp_path):
    path = _write(tmp_path, FULL)
    cluster = load_cluster(cluster_file=str(path))
    conf = path.parent.resolve()
    n1, n2, n3 = cluster.nodes
    assert (cluster.master, cluster.master_port, cluster.workdir) == (
        "gpu-node-2",
        29600,
        "/data/project",
    )
    assert cluster.source == str(path)
    assert [(n.host, n.slots, n.gpu_ids) for n in cluster.nodes] == [
        ("gpu-node-1", 8, tuple(range(8))),
        ("gpu-node-2", 4, (0, 1, 2, 3)),
        ("10.0.0.3", 1, (0,)),  # bare string node, default slots
    ]
    assert cluster.world_size == 13
    # env: cluster-wide values, the node's own win
    assert dict(n1.env) == {"HF_HOME": "/data/hf", "NCCL_DEBUG": "WARN"}
    assert dict(n2.env) == {"HF_HOME": "/data/hf", "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5"}
    # python: launching interpreter unless the node says otherwise
    assert n1.python == sys.executable == n3.python
    assert n2.python == "/opt/conda/envs/train/bin/python"
    assert (n1.interface, n2.interface) == ("ens14f0", None)
    # ssh: node fields over cluster fields; node options first (OpenSSH keeps the first value)
    assert (n1.ssh.user, n1.ssh.port) == ("root", 2222)
    assert (n2.ssh.user, n2.ssh.port) == ("trainer", 2222)
    assert n1.ssh.options == ("-o", "Compression=yes")
    assert n2.ssh.options == ("-o", "Compression=no", "-o", "Compression=yes")
    # relative paths are relative to the yaml's directory, not the cwd
    assert n1.ssh.identity_file == str(conf / "keys" / "id_ed25519")
    assert n2.ssh.identity_file == str(conf / "keys" / "id_ed25519")
    assert n2.ssh.known_hosts_file == str(conf / "kh") and n1.ssh.known_hosts_file is None


def test_defaults_and_cluster_wide_slots(tmp_path):
    cluster = parse_cluster_yaml("slots: 2\nnodes: [a, {host: b, slots: 3}]\n")
    assert [(n.host, n.slots) for n in cluster.nodes] == [("a", 2), ("b", 3)]
    assert (cluster.master, cluster.master_port, cluster.workdir) == (
        "a",
        DEFAULT_MASTER_PORT,
        None,
    )
    assert dict(cluster.env) == {}


def test_env_values_are_strings(tmp_path):
    cluster = parse_cluster_yaml("env: {A: 1, B: true, C: 'x y;z'}\nnodes: [a]\n")
    assert dict(cluster.nodes[0].env) == {"A": "1", "B": "true", "C": "x y;z"}


def test_absolute_and_home_paths_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = parse_cluster_yaml(
        "ssh: {identity_file: ~/.ssh/id, config_file: /etc/ssh/c}\nnodes: [a]"
    )
    assert cluster.nodes[0].ssh.identity_file == str(tmp_path / ".ssh" / "id")
    assert cluster.nodes[0].ssh.config_file == "/etc/ssh/c"


def test_ssh_config_flag_applies_where_the_node_names_none(tmp_path):
    path = _write(tmp_path, "nodes: [a, {host: b, ssh: {config_file: /etc/b.conf}}]\n")
    cluster = load_cluster(cluster_file=str(path), ssh_config="/etc/all.conf")
    assert [n.ssh.config_file for n in cluster.nodes] == ["/etc/all.conf", "/etc/b.conf"]


def test_cluster_wide_connect_timeout_reaches_nodes():
    cluster = parse_cluster_yaml("ssh: {connect_timeout: 30}\nnodes: [a]\n")
    assert cluster.nodes[0].ssh.connect_timeout == 30


# ----------------------------------------------------------------------------- errors


def _error(text: str) -> SpecError:
    with pytest.raises(SpecError) as err:
        parse_cluster_yaml(textwrap.dedent(text), "c.yaml")
    assert err.value.source == "c.yaml"
    assert err.value.fix
    return err.value


@pytest.mark.parametrize(
    "options",
    ['["-o", "StrictHostKeyChecking=no"]', '["-oStrictHostKeyChecking=accept-new"]',
     '["-o", "stricthostkeychecking off"]', '["-o", "UserKnownHostsFile=/dev/null"]'],
)  # fmt: skip
def test_ssh_options_that_trust_any_host_key_are_refused_with_their_line(options):
    """ssh takes an option's first value: one in cluster.yaml would override trainfleet's own
    -oStrictHostKeyChecking=yes on the node-to-node checks (#17)."""
    err = _error(f"nodes: [a]\nssh:\n  user: x\n  options: {options}\n")
    assert err.line == 4
    assert "host key checking off" in str(err) and "setup ssh" in err.fix
    parse_cluster_yaml('nodes: [a]\nssh:\n  options: ["-o", "StrictHostKeyChecking=yes"]\n')


@pytest.mark.parametrize(
    ("text", "line", "valid"),
    [
        ("nodes: [a]\nmaster_prot: 1\n", 2, "master_port"),
        ("nodes:\n  - host: a\n    slot: 2\n", 3, "interface"),
        ("nodes: [a]\nssh:\n  user: x\n  key: y\n", 4, "identity_file"),
    ],
)
def test_unknown_key_lists_valid_keys(text, line, valid):
    err = _error(text)
    assert err.line == line
    assert "unknown key" in str(err)
    assert "valid keys" in err.fix and valid in err.fix


def test_duplicate_host_names_the_first_line():
    err = _error("nodes:\n  - a\n  - b\n  - host: a\n")
    assert err.line == 4
    assert "first on line 2" in str(err)


@pytest.mark.parametrize("slots", ["0", "-1", "1.5", "'8'", "true", "[1]"])
def test_bad_slots(slots):
    err = _error(f"nodes:\n  - host: a\n    slots: {slots}\n")
    assert err.line == 3
    assert "slots" in str(err)


def test_master_must_be_a_node():
    err = _error("nodes: [a, b]\nmaster: c\n")
    assert err.line == 2
    assert "'c'" in str(err) and "a, b" in err.fix


def test_invalid_yaml_syntax_reports_the_line():
    err = _error("nodes:\n  - host: a\n  - host: [b\n")
    assert err.line is not None and err.line >= 3
    assert "not valid YAML" in str(err)


def test_duplicate_key_reports_the_second():
    err = _error("nodes: [a]\nmaster: a\nmaster: a\n")
    assert err.line == 3
    assert "appears twice" in str(err)


@pytest.mark.parametrize("name", ["1A", "A-B", "'A B'", "'$(id)'"])
def test_env_with_bad_name(name):
    err = _error(f"nodes:\n  - host: a\n    env:\n      OK: 1\n      {name}: 2\n")
    assert err.line == 5
    assert "environment variable name" in str(err)


@pytest.mark.parametrize("value", ["'/usr/bin/python; rm -rf ~'", "'$(id)'", "'py thon'"])
def test_python_path_with_metacharacters(value):
    err = _error(f"nodes:\n  - host: a\n    python: {value}\n")
    assert err.line == 3
    assert "python" in str(err) and "remote shell" in str(err)


@pytest.mark.parametrize("value", ["'eth0;id'", "'$(id)'", "'e th0'"])
def test_interface_with_metacharacters(value):
    err = _error(f"nodes:\n  - host: a\n    interface: {value}\n")
    assert err.line == 3
    assert "interface" in str(err)


@pytest.mark.parametrize("nodes", ["", "[]", "{}", "a"])
def test_empty_or_missing_nodes(nodes):
    err = _error(f"master_port: 1\nnodes: {nodes}\n")
    assert err.line == 2
    assert "non-empty list" in str(err)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n"])
def test_document_must_be_a_mapping(text):
    assert "mapping" in str(_error(text))


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("nodes:\n  - host: 'a;id'\n", "metacharacters"),
        ("nodes:\n  - host: 5\n", "must be a string"),
        ("nodes:\n  - slots: 1\n", "without `host:`"),
        ("nodes:\n  - [a]\n", "mapping or a host name"),
        ("nodes: [a]\nssh: {port: 70000}\n", "ssh port"),
        ("nodes: [a]\nssh: {user: 'ro ot'}\n", "ssh user"),
        ("nodes: [a]\nssh: {options: -v}\n", "list of strings"),
        ("nodes: [a]\nssh: root\n", "ssh must be a mapping"),
        ("nodes: [a]\nworkdir: '/data; id'\n", "workdir"),
        ("nodes: [a]\nenv: [A]\n", "env must be a mapping"),
        ("nodes: [a]\nenv: {A: [1]}\n", "string or number"),
        ("nodes: [a]\nx: !!python/object:os.system {}\n", "not valid YAML"),
        # hypothesis found it: PyYAML's scanner raised a bare ValueError from chr()
        ('nodes: [a]\nworkdir: "\\U00110000"\n', "c.yaml:2: not valid YAML (chr() arg"),
    ],
)
def test_other_errors(text, what):
    assert what in str(_error(text))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('!!int ""', "'' is not a valid !!int"),  # an IndexError inside PyYAML once
        ('!!int "0x"', "'0x' is not a valid !!int"),
        ('!!int "-"', "'-' is not a valid !!int"),
        ('!!int "_"', "'_' is not a valid !!int"),
        ('!!float ""', "'' is not a valid !!float"),
        ('!!float "-"', "'-' is not a valid !!float"),
        ('!!bool ""', "'' is not a valid !!bool"),  # a KeyError
        ("!!bool maybe", "'maybe' is not a valid !!bool"),
        ('!!timestamp "x"', "'x' is not a valid !!timestamp"),  # an AttributeError
        ("!!timestamp 0000-01-01", "year 0 is out of range"),
        ('!!binary "\u00e9"', "failed to convert base64"),
        ("!!binary a", "failed to decode base64"),
        ("!!str {a: 1}", "expected a scalar node"),
        ("!!set abc", "!!set needs a mapping, got a scalar"),
        ("!!map [a]", "!!map needs a mapping, got a sequence"),
        ("!!seq {a: 1}", "!!seq needs a sequence, got a mapping"),
        ("!!omap abc", "expected a sequence"),
        ("!!python/object/apply:os.system [id]", "could not determine a constructor"),
        ("!!python/name:os.system ''", "could not determine a constructor"),
        ('!!binary "%%%"', "slots must be an integer"),  # read (as b''), then refused
    ],
)
def test_a_value_its_tag_cannot_read_is_an_error_on_its_line(tmp_path, value, says):
    """cluster.yaml errors name the file and line, an exception inside one of PyYAML's
    constructors included (`slots: !!int ""` ended in a traceback)."""
    path = _write(tmp_path, f"# cluster\nnodes: [a]\nslots: {value}\nmaster_port: 29500\n")
    with pytest.raises(SpecError) as err:
        load_cluster(cluster_file=str(path))
    assert str(err.value).startswith(f"{path}:3: ")
    assert (err.value.source, err.value.line) == (str(path), 3)
    assert says in str(err.value)
    assert err.value.fix


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("", 1, "must be a mapping"),
        ("# only a comment\n\n", 1, "must be a mapping"),
        ("# c\n\njust a string\n", 3, "must be a mapping"),
        ("# c\n- a\n- b\n", 2, "must be a mapping"),
        ("# c\n!!int 5\n", 2, "must be a mapping"),
        ("nodes: [a]\nenv: {A: 1}\n\x01\n", 3, "character #x0001"),
        ("nodes: [a]\r\n\r\nx: \x00\n", 3, "character #x0000"),
        ("nodes: [a]\n\nslots: " + "[" * 2000 + "]" * 2000, 3, "nested more than 100 levels"),
        ("nodes: [a]\n\nslots:\n" + "".join(f"{'  ' * i}- \n" for i in range(150)), 103, "nested"),
    ],
)
def test_every_malformed_document_names_a_line(text, line, says):
    err = _error(text)
    assert err.line == line, str(err)
    assert says in str(err)


def test_missing_cluster_file(tmp_path):
    with pytest.raises(SpecError) as err:
        load_cluster(cluster_file=str(tmp_path / "nope.yaml"))
    assert "cluster file not found" in str(err.value)


def test_load_cluster_reports_the_path_and_line(tmp_path):
    path = _write(tmp_path, "nodes: [a]\nbogus: 1\n")
    with pytest.raises(SpecError) as err:
        load_cluster(cluster_file=str(path))
    assert str(err.value).startswith(f"{path}:2: unknown key 'bogus'")


# ----------------------------------------------------------------------------- other sources


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hosts": "a", "hostfile": "h"},
        {"hosts": "a", "cluster_file": "c"},
        {"hostfile": "h", "cluster_file": "c"},
    ],
)
def test_more_than_one_source(kwargs):
    with pytest.raises(SpecError) as err:
        load_cluster(**kwargs)
    assert "more than one cluster source" in str(err.value)


def test_hosts_flag():
    cluster = load_cluster(hosts="a:8, b ,10.0.0.1:2,fe80::1")
    assert [(n.host, n.slots, n.gpu_ids) for n in cluster.nodes] == [
        ("a", 8, tuple(range(8))),
        ("b", 1, (0,)),
        ("10.0.0.1", 2, (0, 1)),
        ("fe80::1", 1, (0,)),
    ]
    assert cluster.master == "a" and cluster.source == "--hosts"


@pytest.mark.parametrize(
    ("hosts", "what"),
    [
        ("a,a:2", "appears twice"),
        ("a:0", "must be a number in 1..4096"),
        ("a,,b", "empty host name"),
        ("a;id", "metacharacters"),
        ("-oProxyCommand=id", "starts with '-'"),
    ],
)
def test_hosts_flag_errors(hosts, what):
    with pytest.raises(SpecError) as err:
        load_cluster(hosts=hosts)
    assert err.value.source == "--hosts"
    assert what in str(err.value)


def test_default_is_this_machine_alone():
    cluster = load_cluster()
    (node,) = cluster.nodes
    assert node.host == "localhost" and node.is_local
    assert node.slots >= 1 and node.gpu_ids == tuple(range(node.slots))
    assert node.python == sys.executable
    assert cluster.master == "localhost" and cluster.source == "<local>"


@pytest.mark.parametrize(
    ("hosts", "local"), [("localhost", True), ("127.0.0.1", True), ("h", False)]
)
def test_local_names_run_without_ssh(hosts, local):
    assert load_cluster(hosts=hosts).nodes[0].is_local is local


def test_localhost_with_ssh_user_goes_through_ssh():
    cluster = parse_cluster_yaml("nodes: [{host: localhost, ssh: {user: root}}]")
    assert not cluster.nodes[0].is_local
