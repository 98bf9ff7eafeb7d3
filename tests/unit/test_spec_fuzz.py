"""Property tests: any spec text either parses into safe hosts or fails with a SpecError.

A user who mistypes a hostfile, cluster.yaml, --hosts or --include must get `trainfleet: file:line:
problem: fix`, never a traceback; and nothing that parses may carry a shell metacharacter.

Inputs that once escaped as other exception types are kept as regression tests at the end.
"""

from __future__ import annotations

import io
import json
import re
import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainfleet.cluster import filter_nodes, load_cluster, parse_cluster_yaml, parse_hostfile
from trainfleet.errors import SpecError

pytestmark = pytest.mark.unit

SAFE_HOST = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]*")  # no leading "-"; fullmatch, not $

FUZZ = settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _parse(fn, *args, **kwargs):
    """fn(...)'s result, or None for a SpecError; any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except SpecError as err:
        assert err.fix, f"SpecError without a fix: {err}"
        return None


def _assert_safe_hosts(hosts):
    for host in hosts:
        assert SAFE_HOST.fullmatch(host), f"unsafe host survived parsing: {host!r}"


# ----------------------------------------------------------------------------- regressions


# ----------------------------------------------------------------------------- strategies

HOSTS = ["worker-0", "worker-1", "10.0.0.1", "fe80::1", "gpu_node.example.com", "localhost"]
PUNCT = string.punctuation + " \t\n"


def _mostly(valid, other, odds: int = 8):
    """`valid`, but `other` (a near miss) about once in `odds` draws."""
    return st.sampled_from([valid] * (odds - 1) + [other]).flatmap(lambda strategy: strategy)


@st.composite
def near_miss_host(draw) -> str:
    host = draw(st.sampled_from(HOSTS))
    for _ in range(draw(st.sampled_from([0] * 8 + [1, 2]))):
        at = draw(st.integers(0, len(host)))
        host = host[:at] + draw(st.text(PUNCT, min_size=1, max_size=2)) + host[at:]
    return host


slot_text = _mostly(
    st.integers(0, 5).map(str),
    st.one_of(st.integers(-2, 99999).map(str), st.text("0123456789x-+ ,", max_size=4)),
)


@st.composite
def hostfile_text(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["entry"] * 9 + ["comment", "blank", "junk"]))
        if kind == "entry":
            ws = draw(st.sampled_from(["", " ", "\t", "   "]))
            sep = draw(_mostly(st.sampled_from([" ", "\t", "  "]), st.sampled_from(["", ":"]), 12))
            key = draw(_mostly(st.just("slots="), st.sampled_from(["slot=", "", "slots ="]), 12))
            tail = draw(st.sampled_from(["", "", "", " # c", " max_slots=9", "x", ";id"]))
            slots = draw(_mostly(st.integers(1, 8).map(str), slot_text))
            lines.append(f"{ws}{draw(near_miss_host())}{sep}{key}{slots}{tail}{ws}")
        elif kind == "comment":
            lines.append("#" + draw(st.text(max_size=10)).replace("\n", " "))
        elif kind == "blank":
            lines.append(draw(st.sampled_from(["", "  ", "\t"])))
        else:
            lines.append(draw(st.text(max_size=12)))
    return "\n".join(lines)


@st.composite
def node_spec(draw) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        part = draw(near_miss_host())
        if draw(st.booleans()):
            part += ":" + ",".join(draw(st.lists(slot_text, min_size=1, max_size=3)))
        parts.append(part)
    return "@".join(parts)


yaml_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.sampled_from(HOSTS + ["/usr/bin/python3", "eth0", "root", "keys/id", "~/.ssh/x"]),
    st.text(
        # No '\n': a value ending in one is a known bug (test_trailing_newline_*).
        st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\t;$`'\"-:@ "),
        max_size=10,
    ),
)
yaml_value = st.recursive(
    yaml_scalar,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3)), kids, max_size=3)
    ),
    max_leaves=12,
)
YAML_HOSTS = [*HOSTS, "n1", "n2", "n3", "n4", "n5"]
yaml_host = _mostly(st.sampled_from(YAML_HOSTS), near_miss_host())
yaml_env = st.dictionaries(
    _mostly(st.sampled_from(["A", "NCCL_DEBUG", "HF_HOME"]), st.text(max_size=4)),
    yaml_scalar,
    max_size=3,
)
yaml_ssh = st.fixed_dictionaries(
    {},
    optional={
        "user": _mostly(st.sampled_from(["root", "ubuntu"]), yaml_value),
        "port": _mostly(st.integers(1, 65535), yaml_value),
        "identity_file": _mostly(st.sampled_from(["keys/id", "~/.ssh/id", "/k"]), yaml_value),
        "options": _mostly(st.just(["-o", "Compression=yes"]), yaml_value),
        "connect_timeout": _mostly(st.integers(1, 60), yaml_value),
    },
)
COMMON_FIELDS = {
    "slots": _mostly(st.integers(1, 8), yaml_value),
    "python": _mostly(st.sampled_from(["/usr/bin/python3", "~/venv/bin/python"]), yaml_value),
    "env": _mostly(yaml_env, yaml_value),
    "ssh": _mostly(yaml_ssh, yaml_value),
}
yaml_node = _mostly(
    st.one_of(
        yaml_host,
        st.fixed_dictionaries(
            {"host": yaml_host},
            optional={**COMMON_FIELDS, "interface": _mostly(st.just("eth0"), yaml_value)},
        ),
    ),
    yaml_value,
)
cluster_doc = st.builds(
    lambda rest, junk, nodes: {**rest, **junk, "nodes": nodes},
    st.fixed_dictionaries(
        {},
        optional={
            **COMMON_FIELDS,
            "master": _mostly(yaml_host, yaml_value),
            "master_port": _mostly(st.integers(1, 65535), yaml_value),
            "workdir": _mostly(st.sampled_from(["/data", "~/w"]), yaml_value),
        },
    ),
    _mostly(st.just({}), st.dictionaries(st.sampled_from(["node", "hosts", "gpus"]), yaml_value)),
    _mostly(st.lists(yaml_node, min_size=1, max_size=4), yaml_value),
)


# ----------------------------------------------------------------------------- properties


@FUZZ
@given(st.one_of(st.text(), hostfile_text()))
def test_hostfile_parses_safely_or_spec_error(text):
    pool = _parse(parse_hostfile, text)
    if pool is not None:
        _assert_safe_hosts(pool)
        assert all(slots > 0 for slots, _ in pool.values())
        lines = [line for _, line in pool.values()]
        assert lines == sorted(set(lines)) and lines[-1] <= len(text.splitlines())


@FUZZ
@given(st.one_of(st.text(), hostfile_text()))
@example("a slots=4\u0663\n")  # DeepSpeed's \d reads 43; trainfleet once read 4
@example("a slots=1\fb slots=2\n")  # one line to DeepSpeed; trainfleet once found b too
@example("a slots=1 slots=2\n")
def test_a_hostfile_that_parses_means_what_it_means_to_deepspeed(text):
    """Nothing DeepSpeed 0.19.8's runner refuses or reads otherwise is accepted (trainfleet
    refuses more: slots=0, metacharacters, text after the count)."""
    runner = pytest.importorskip("deepspeed.launcher.runner", reason="deepspeed is not installed")
    pool = _parse(parse_hostfile, text)
    if pool is None:
        return
    lines = io.StringIO(text, newline=None).readlines()  # as fetch_hostfile reads the file
    assert dict(runner._parse_hostfile(lines)) == {host: n for host, (n, _) in pool.items()}


@FUZZ
@given(st.one_of(st.text(), st.lists(node_spec(), min_size=1, max_size=4).map(",".join)))
def test_hosts_flag_parses_safely_or_spec_error(hosts):
    cluster = _parse(load_cluster, hosts=hosts)
    if cluster is not None:
        _assert_safe_hosts(n.host for n in cluster.nodes)
        assert all(n.slots == len(n.gpu_ids) > 0 for n in cluster.nodes)
        assert cluster.master == cluster.nodes[0].host


FILTER_NODES = list(load_cluster(hosts="worker-0:4,worker-1:2,10.0.0.1:3,fe80::1").nodes)


@FUZZ
@given(
    st.one_of(st.text(), node_spec()),
    st.sampled_from(["include", "exclude", "both"]),
)
def test_filter_nodes_is_a_subset_or_spec_error(spec, which):
    kwargs = {"include": spec, "exclude": spec} if which == "both" else {which: spec}
    kept = _parse(filter_nodes, FILTER_NODES, **kwargs)
    if kept is None:
        return
    assert kept, "filter_nodes returned no node without an error"
    assert which != "both" or not spec
    original = {n.host: n for n in FILTER_NODES}
    hosts = [n.host for n in kept]
    assert hosts == [h for h in original if h in hosts], "cluster order not kept"
    for node in kept:
        assert node.slots == len(node.gpu_ids) > 0
        assert list(node.gpu_ids) == sorted(set(node.gpu_ids))
        assert set(node.gpu_ids) <= set(original[node.host].gpu_ids)


def _check_cluster_yaml(text: str) -> None:
    cluster = _parse(parse_cluster_yaml, text)
    if cluster is not None:
        _assert_safe_hosts(n.host for n in cluster.nodes)
        assert cluster.nodes and cluster.master in {n.host for n in cluster.nodes}
        assert all(n.slots == len(n.gpu_ids) > 0 for n in cluster.nodes)


@FUZZ
@given(st.text())
def test_cluster_yaml_arbitrary_text(text):
    _check_cluster_yaml(text)


@FUZZ
@given(cluster_doc, st.data())
def test_cluster_yaml_structured_documents(doc, data):
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    # Near misses: drop one character of the valid document now and then.
    if data.draw(st.booleans()) and text:
        at = data.draw(st.integers(0, len(text) - 1))
        text = text[:at] + text[at + 1 :]
    _check_cluster_yaml(text)


SAFE_TAGS = "int float bool null str binary timestamp set omap pairs seq map merge value yaml"
YAML_TAGS = [
    *(f"!!{name}" for name in SAFE_TAGS.split()),
    # Refused by the safe loader; were one ever read, it would call a harmless builtin.
    "!!python/object/apply:builtins.repr",
    "!!python/name:builtins.repr",
    "!!python/tuple",
    "!local",
    "!<tag:example.com,2000:x>",
]
tagged_value = st.builds(
    "{} {}".format,
    st.sampled_from(YAML_TAGS),
    st.one_of(
        st.sampled_from(
            ['""', '"-"', '"+"', '"_"', '"0x"', '"0b"', '"0o"', '":"', '"1:"', '"."', '"%%%"']
            + ["1e400", ".nan", "0000-01-01", "2001-13-45", "[]", "{}", "[a, 1]", "{a: 1}"]
            + ["{? [a]}", "[{a: 1, b: 2}]", "[{[a]: 1}]", "[[a]]", "{a: {b: c}}"]
        ),
        st.text(st.characters(codec="utf-8"), max_size=8).map(json.dumps),
    ),
)
# Each template puts the tagged value on its line 3: every error it causes belongs there.
TAGGED_DOCUMENTS = [
    "# a cluster\nnodes: [a]\nslots: {}\n",
    "nodes:\n  - host: a\n    slots: {}\n",
    "nodes:\n  - a\n  - {}\n",
    "nodes: [a]\nenv:\n  A: {}\n",
    "nodes: [a]\nssh:\n  port: {}\n",
    "nodes: [a]\nmaster_port: 1\n{}: 1\n",
    "# a cluster\n\n{}\n",
]


@FUZZ
@given(st.sampled_from(TAGGED_DOCUMENTS), tagged_value)
@example(TAGGED_DOCUMENTS[0], '!!int ""')  # once an IndexError inside PyYAML
@example(TAGGED_DOCUMENTS[1], '!!bool ""')  # once a KeyError
@example(TAGGED_DOCUMENTS[6], "!!set abc")  # once a SpecError without a line
def test_a_tagged_value_parses_or_is_a_spec_error_on_its_line(template, value):
    try:
        parse_cluster_yaml(template.format(value), "c.yaml")
    except SpecError as err:
        assert (err.source, err.line) == ("c.yaml", 3), str(err)
        assert err.fix


# ----------------------------------------------------------------------------- regressions


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "nodes: [a]\n\x01\n",
            id="control-character",
        ),
        pytest.param(
            "nodes: [2001-13-45]\n",
            id="impossible-date",
        ),
        pytest.param(
            "nodes: [a]\nslots: !!int x\n",
            id="explicit-int-tag",
        ),
        pytest.param(
            "nodes: [a]\nslots: !!timestamp x\n",
            id="explicit-timestamp-tag",
        ),
        pytest.param(
            "nodes: [a]\nslots: 1" + "0" * 5000 + "\n",
            id="huge-int",
        ),
        pytest.param(
            "nodes: [a]\nmaster: [a]\n",
            id="master-list",
        ),
        pytest.param(
            'nodes: [a]\nssh: {identity_file: "a\\0b"}\n',
            id="nul-in-path",
        ),
        pytest.param(
            "[" * 2000 + "]" * 2000,
            id="deep-nesting",
        ),
    ],
)
def test_known_bad_cluster_yaml_gives_spec_error(text):
    with pytest.raises(SpecError):
        parse_cluster_yaml(text)


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param("a:²", id="superscript-slots"),
        pytest.param("a:" + "9" * 30, id="overflow-slots"),
    ],
)
def test_known_bad_hosts_flag_gives_spec_error(hosts):
    with pytest.raises(SpecError):
        load_cluster(hosts=hosts)


@pytest.mark.parametrize(
    "text",
    [
        'nodes: ["a\\n"]\n',
        'nodes: [a]\npython: "/usr/bin/python\\n"\n',
        'nodes: [a]\nworkdir: "/data\\n"\n',
        'nodes: [a]\nssh: {user: "root\\n"}\n',
        'nodes: [{host: a, interface: "eth0\\n"}]\n',
    ],
    ids=["host", "python", "workdir", "ssh-user", "interface"],
)
def test_trailing_newline_is_rejected_in_cluster_yaml(text):
    with pytest.raises(SpecError):
        parse_cluster_yaml(text)


def test_trailing_newline_is_rejected_in_hosts_flag():
    with pytest.raises(SpecError):
        load_cluster(hosts="a\n:2")
