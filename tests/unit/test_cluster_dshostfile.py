"""DeepSpeed hostfiles: read exactly as DeepSpeed's runner reads them, errors that name the line."""

from __future__ import annotations

import io

import pytest

from trainfleet.cluster import load_cluster, parse_hostfile
from trainfleet.errors import SpecError

pytestmark = pytest.mark.unit


def _spec_error(text: str, source: str = "hostfile") -> SpecError:
    with pytest.raises(SpecError) as err:
        parse_hostfile(text, source)
    assert err.value.source == source
    assert err.value.fix, "every SpecError must say how to fix it"
    return err.value


def test_deepspeed_hostfile_keeps_order_slots_and_lines():
    text = (
        "# training nodes\n"
        "\n"
        "worker-1 slots=8\n"
        "   worker-0   slots=4   \n"
        "\t# a comment after indentation\n"
        "worker-2\tslots=2\n"
    )
    assert parse_hostfile(text) == {"worker-1": (8, 3), "worker-0": (4, 4), "worker-2": (2, 6)}
    assert list(parse_hostfile(text)) == ["worker-1", "worker-0", "worker-2"]


@pytest.mark.parametrize(
    "line",
    [
        "worker-0 slots=4 # four GPUs",
        "worker-0 slots=4# four GPUs",
        "worker-0 slots=4 max_slots=8",  # MPI's extra field
        "worker-0 slots=4\tmax-slots=8  # MPI spells it both ways",
    ],
)
def test_a_comment_or_mpis_max_slots_may_follow_the_count(line):
    assert parse_hostfile(line) == {"worker-0": (4, 1)}


@pytest.mark.parametrize(
    ("line", "tail"),
    [
        ("node-1 slots=8;reboot", "';reboot'"),
        ("node-1 slots=1 slots=2", "' slots=2'"),  # DeepSpeed takes the first: 1
        ("node-1 slots=2 junk", "' junk'"),
        ("node-1 slots=4xyz", "'xyz'"),
        ("node-1 slots=2\x00", "'\\x00'"),
        ("node-1 slots=4\u0663", "'\u0663'"),  # DeepSpeed's \d reads the Arabic 3: 43 slots
        ("node-1 slots=4 max_slots=", "' max_slots='"),
        ("node-1 slots=4 max_slots=8 x", "' max_slots=8 x'"),
    ],
)
def test_text_after_the_slot_count_is_refused_naming_file_and_line(line, tail):
    """DeepSpeed's runner reads `^(\\S+)\\s+slots=(\\d+)` and ignores the rest of the line: a
    typo or an injected `;reboot` would pass unseen. Here it is an error on its line."""
    err = _spec_error(f"ok slots=1\n# c\n{line}\n", "hf")
    assert err.line == 3
    assert str(err).startswith(f"hf:3: bad entry {line!r}: unexpected {tail} after `slots=")
    assert "HOST slots=N" in err.fix


def test_lines_end_only_where_deepspeed_sees_a_line_end():
    """DeepSpeed splits with readlines() (LF, CRLF, CR); str.splitlines() also split at a form
    feed or U+2028, which made two hosts of what DeepSpeed reads as one line with junk."""
    assert parse_hostfile("a slots=1\r\nb slots=2\rc slots=3\n") == {
        "a": (1, 1),
        "b": (2, 2),
        "c": (3, 3),
    }
    for separator in ("\f", "\v", "\x1c", "\x85", "\u2028", "\u2029"):
        err = _spec_error(f"x slots=1\na slots=1{separator}b slots=2\n")
        assert err.line == 2, repr(separator)
        assert "unexpected" in str(err)


# Hostfiles DeepSpeed 0.19.8's runner reads; trainfleet must read each the same way.
DEEPSPEED_READS = [
    "worker-0 slots=4\n",
    "# training nodes\n\nworker-1 slots=8\n   worker-0   slots=4   \n\t# c\nworker-2\tslots=2\n",
    "worker-0 slots=4 # four GPUs\nworker-1 slots=2 max_slots=8\n",
    "a slots=01\r\nb slots=2\rc slots=3",
    "10.0.0.1 slots=2\nfe80::1%eth0 slots=1\n",
]
# Hostfiles DeepSpeed refuses (ValueError); trainfleet must refuse them too.
DEEPSPEED_REFUSES = [
    "",
    "# only a comment\n\n",
    "worker-0\n",
    "worker-0 slots = 4\n",
    "slots=4\n",
    "worker-0 slots=-1\n",
    "a slots=1\na slots=2\n",
]
# Hostfiles DeepSpeed reads while ignoring part of a line; trainfleet refuses them on purpose.
DEEPSPEED_IGNORES_PART = [
    "node-1 slots=8;reboot\n",
    "a slots=1 slots=2\n",
    "a slots=4\u0663\n",
    "a slots=1\fb slots=2\n",
]


def _deepspeed_reads(text: str) -> dict[str, int] | None:
    """What DeepSpeed's own parser makes of `text` (as `fetch_hostfile` reads a file), or None
    when it refuses it."""
    runner = pytest.importorskip("deepspeed.launcher.runner", reason="deepspeed is not installed")
    try:
        return dict(runner._parse_hostfile(io.StringIO(text, newline=None).readlines()))
    except ValueError:
        return None


def _trainfleet_reads(text: str) -> dict[str, int] | None:
    try:
        return {host: slots for host, (slots, _line) in parse_hostfile(text).items()}
    except SpecError:
        return None


@pytest.mark.parametrize("text", DEEPSPEED_READS)
def test_what_deepspeed_reads_is_read_the_same(text):
    assert _deepspeed_reads(text) is not None
    assert _trainfleet_reads(text) == _deepspeed_reads(text)


@pytest.mark.parametrize("text", DEEPSPEED_REFUSES)
def test_what_deepspeed_refuses_is_refused(text):
    assert _deepspeed_reads(text) is None
    assert _trainfleet_reads(text) is None


@pytest.mark.parametrize("text", DEEPSPEED_IGNORES_PART)
def test_what_deepspeed_reads_only_in_part_is_refused(text):
    assert _deepspeed_reads(text) is not None  # the error message says DeepSpeed is silent
    assert _trainfleet_reads(text) is None


@pytest.mark.parametrize(
    "host",
    [
        "10.0.0.1",
        "192.168.1.254",
        "fe80::1",
        "2001:db8::42",
        "fe80::1%eth0",
        "gpu-node-1",
        "gpu_node.example.com",
        "A100box",
    ],
)
def test_addresses_and_ssh_aliases_are_accepted(host):
    assert parse_hostfile(f"{host} slots=2") == {host: (2, 1)}


def test_ipv6_loopback_is_accepted():
    assert parse_hostfile("::1 slots=1") == {"::1": (1, 1)}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("worker-0 slots=4\nworker-1\n", 2),  # no slots
        ("worker-0 slots=4\n\n# c\nworker-1 slots=x\n", 4),
        ("worker-0 slots = 4\n", 1),  # DeepSpeed's regex has no spaces around '='
        ("slots=4\n", 1),
        ("worker-0 slots=-1\n", 1),
    ],
)
def test_bad_entry_names_its_line(text, line):
    err = _spec_error(text)
    assert err.line == line
    assert "bad entry" in str(err)
    assert f"hostfile:{line}:" in str(err)
    assert "HOST slots=N" in err.fix


def test_duplicate_host_names_both_lines():
    err = _spec_error("a slots=1\n# x\nb slots=1\na slots=2\n")
    assert err.line == 4
    assert "'a'" in str(err) and "first on line 1" in str(err)


def test_zero_slots_is_an_error_not_a_skipped_node():
    err = _spec_error("a slots=1\nb slots=0\n")
    assert err.line == 2
    assert "slots for 'b' must be a number in 1..4096, got '0'" in str(err)
    assert "b slots=8" in err.fix


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n   \n#x slots=1\n"])
def test_empty_hostfile_is_an_error(text):
    err = _spec_error(text)
    assert err.line is None
    assert "no hosts" in str(err)


def test_shell_command_in_host_is_never_accepted():
    err = _spec_error("ok slots=1\na;rm -rf ~ slots=1\n")
    assert err.line == 2


@pytest.mark.parametrize("host", ["a;rm", "a|b", "$(id)", "a`id`", "a&&b", "a>b", "a'b", 'a"b'])
def test_metacharacters_in_host_are_named(host):
    err = _spec_error(f"{host} slots=1")
    assert err.line == 1
    assert "metacharacters" in str(err)
    assert "never run" in str(err)


def test_host_starting_with_dash_would_be_an_ssh_option():
    err = _spec_error("-oProxyCommand=id slots=1")
    assert err.line == 1
    assert "starts with '-'" in str(err)


def test_host_with_at_sign_is_explained():
    err = _spec_error("root@gpu-node-1 slots=8")
    assert "'@'" in str(err)
    assert "ssh" in err.fix


# ----------------------------------------------------------------------------- load_cluster


def test_load_cluster_from_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=2\nworker-1 slots=4\n")
    cluster = load_cluster(hostfile=str(path))
    assert [(n.host, n.slots, n.gpu_ids) for n in cluster.nodes] == [
        ("worker-0", 2, (0, 1)),
        ("worker-1", 4, (0, 1, 2, 3)),
    ]
    assert cluster.master == "worker-0"
    assert cluster.world_size == 6
    assert cluster.source == str(path)
    assert not any(n.is_local for n in cluster.nodes)


def test_load_cluster_reports_errors_against_the_file_path(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=2\nworker-0 slots=2\n")
    with pytest.raises(SpecError) as err:
        load_cluster(hostfile=str(path))
    assert err.value.source == str(path)
    assert err.value.line == 2
    assert str(err.value).startswith(f"{path}:2: ")


def test_missing_hostfile_stops_where_deepspeed_would_fall_back(tmp_path):
    path = tmp_path / "no-such-hostfile"
    with pytest.raises(SpecError) as err:
        load_cluster(hostfile=str(path))
    assert err.value.source == str(path)
    assert "not found" in str(err.value)
    assert "DeepSpeed would" in err.value.fix


def test_unreadable_hostfile_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as err:
        load_cluster(hostfile=str(tmp_path))  # a directory
    assert "cannot read" in str(err.value)


def test_binary_hostfile_is_a_spec_error(tmp_path):
    path = tmp_path / "hostfile"
    path.write_bytes(b"\xff\xfe\x00 slots=1\n")
    with pytest.raises(SpecError):
        load_cluster(hostfile=str(path))


def test_absurd_slot_count_is_a_spec_error(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(f"worker-0 slots={10**18}\n")
    with pytest.raises(SpecError) as err:
        load_cluster(hostfile=str(path))
    assert err.value.line == 1


def test_overlong_slot_number_is_a_spec_error():
    with pytest.raises(SpecError):
        parse_hostfile("worker-0 slots=" + "9" * 5000)


def test_the_one_hostfile_writer_writes_what_the_reader_reads_or_refuses():
    """setup hostfile, the deepspeed backend and the sandbox write hostfile lines through
    cluster.hostfile.hostfile_text: the text reads back as the slots given, or is refused."""
    from trainfleet.cluster.dshostfile import hostfile_text

    text = hostfile_text({"gpu-node-1": 8, "10.0.0.12": 2}, header="# a comment\n")
    assert text == "# a comment\ngpu-node-1 slots=8\n10.0.0.12 slots=2\n"
    assert parse_hostfile(text) == {"gpu-node-1": (8, 2), "10.0.0.12": (2, 3)}
    with pytest.raises(SpecError):
        hostfile_text({"gpu-node-1;reboot": 8})
    with pytest.raises(SpecError):
        hostfile_text({"gpu-node-1": 0})
