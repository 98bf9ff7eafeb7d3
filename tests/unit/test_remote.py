"""Remote execution without a network: ssh failure classes, argv building, local runs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainfleet.catalog import CATALOG
from trainfleet.cluster import Node, SshOptions, load_cluster
from trainfleet.errors import RemoteError
from trainfleet.remote import (
    Failure,
    NodeResult,
    classify,
    command_argv,
    node_argv,
    run_on_nodes,
    ssh_base_argv,
    worst_returncode,
)

pytestmark = pytest.mark.unit

CHANGED_BANNER = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
Offending ED25519 key in /root/.ssh/known_hosts:3
Host key for 10.0.0.9 has changed and you have requested strict checking.
Host key verification failed.
"""

SSH_STDERR = [
    ("ssh: connect to host 10.0.0.9 port 22: Connection refused", Failure.REFUSED),
    ("ssh: connect to host 10.0.0.9 port 22: Connection timed out", Failure.CONNECT_TIMEOUT),
    ("ssh: connect to host 10.0.0.9 port 22: No route to host", Failure.NO_ROUTE),
    ("ssh: Could not resolve hostname foo: Name or service not known", Failure.DNS),
    ("root@10.0.0.9: Permission denied (publickey,password).", Failure.AUTH),
    ("Host key verification failed.", Failure.HOSTKEY_UNKNOWN),
    (CHANGED_BANNER, Failure.HOSTKEY_CHANGED),
    (
        "Unable to negotiate with 10.0.0.9 port 22: no matching host key type found. "
        "Their offer: ssh-rsa",
        Failure.HOSTKEY_ALGO,
    ),
    ("kex_exchange_identification: read: Connection reset by peer", Failure.SSH_ERROR),
]
PITFALL_IDS = {
    Failure.REFUSED: "ssh-unreachable",
    Failure.CONNECT_TIMEOUT: "ssh-unreachable",
    Failure.NO_ROUTE: "ssh-unreachable",
    Failure.DNS: "hostname-unresolvable",
    Failure.AUTH: "ssh-auth-failed",
    Failure.HOSTKEY_UNKNOWN: "ssh-hostkey-unknown",
    Failure.HOSTKEY_CHANGED: "ssh-hostkey-changed",
    Failure.HOSTKEY_ALGO: "ssh-hostkey-algo",
    Failure.SSH_ERROR: "ssh-unreachable",
}


@pytest.mark.parametrize(("stderr", "failure"), SSH_STDERR)
def test_classify_ssh_messages(stderr, failure):
    got = classify(255, stderr + "\n", timed_out=False, via_ssh=True)
    assert got is failure
    assert got.pitfall_id == PITFALL_IDS[failure]
    assert got.is_connection_failure


def test_every_pitfall_id_is_in_the_catalog():
    for failure in Failure:
        if failure.pitfall_id:
            assert failure.pitfall_id in CATALOG, failure


def test_classify_exit_statuses():
    assert classify(0, "Connection refused", timed_out=False, via_ssh=True) is Failure.NONE
    # rc 255 from a local command is the command's own status, whatever it printed.
    assert classify(255, "Connection refused", False, via_ssh=False) is Failure.COMMAND_FAILED
    # Only 255 is ssh's own failure; other codes are the remote command's.
    assert classify(1, "Permission denied", False, via_ssh=True) is Failure.COMMAND_FAILED
    assert classify(None, "", timed_out=True, via_ssh=True) is Failure.TIMED_OUT
    assert classify(255, "Connection refused", timed_out=True, via_ssh=True) is Failure.TIMED_OUT
    for failure in (Failure.NONE, Failure.COMMAND_FAILED, Failure.TIMED_OUT):
        assert not failure.is_connection_failure and failure.pitfall_id is None


# ----------------------------------------------------------------------------- argv building


def test_ssh_argv_puts_user_options_first(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLEET_CONTROL_DIR", str(tmp_path / "ctl"))
    ssh = SshOptions(
        user="root",
        port=2222,
        identity_file="/k/id",
        known_hosts_file="/k/kh",
        config_file="/k/config",
        options=("-o", "ConnectTimeout=3"),
        connect_timeout=7,
    )
    argv = ssh_base_argv("gpu-node-1", ssh)
    assert argv[:13] == [
        "ssh",
        *("-F", "/k/config"),
        *("-o", "ConnectTimeout=3"),
        *("-i", "/k/id"),
        *("-o", "UserKnownHostsFile=/k/kh"),
        *("-p", "2222"),
        *("-l", "root"),
    ]
    own = argv[13:]
    assert "-oBatchMode=yes" in own and "-oConnectTimeout=7" in own
    # OpenSSH keeps the first value: the user's ConnectTimeout=3 comes before ours.
    assert argv.index("ConnectTimeout=3") < argv.index("-oConnectTimeout=7")
    assert argv[-2:] == ["--", "gpu-node-1"]
    assert any(a.startswith(f"-oControlPath={tmp_path / 'ctl'}/") for a in argv)
    assert (tmp_path / "ctl").is_dir() and (tmp_path / "ctl").stat().st_mode & 0o777 == 0o700


def test_ssh_argv_minimal_without_multiplexing():
    argv = ssh_base_argv("h", SshOptions(), multiplex=False)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "h"]
    assert "-oBatchMode=yes" in argv and "-T" in argv
    assert not any(a in argv for a in ("-F", "-i", "-p", "-l"))
    assert not any("Control" in a for a in argv)


NASTY_ARGS = [
    "hello world",
    "it's",
    'say "hi"',
    "a; rm -rf ~",
    "$(id)",
    "`id`",
    "line1\nline2",
    "$HOME",
    "*",
    "",
    "--",
    "\\",
    "tab\there",
]


def _remote_node(**ssh) -> Node:
    return Node(host="gpu-node-1", slots=1, gpu_ids=(0,), python="python3", ssh=SshOptions(**ssh))


def test_node_argv_remote_quotes_every_word():
    argv = ["python3", "-c", "print(1)", *NASTY_ARGS]
    cmd = node_argv(_remote_node(user="u"), argv, multiplex=False)
    assert cmd[:-1] == ssh_base_argv("gpu-node-1", SshOptions(user="u"), multiplex=False)
    assert shlex.split(cmd[-1]) == argv


def test_remote_shell_receives_exactly_the_argv():
    """What ssh hands the remote shell, run by a real sh here: the argv arrives unchanged."""
    probe = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]
    line = node_argv(_remote_node(), [*probe, *NASTY_ARGS], multiplex=False)[-1]
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == NASTY_ARGS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\x00")), min_size=1, max_size=5))
def test_node_argv_round_trips_any_words(argv):
    assert shlex.split(node_argv(_remote_node(), argv, multiplex=False)[-1]) == argv


def test_node_argv_local_is_unchanged():
    (node,) = load_cluster().nodes
    argv = ["echo", "a b", "$(id)"]
    assert node_argv(node, argv) == argv
    with pytest.raises(RemoteError):
        node_argv(node, [])


@pytest.mark.parametrize(
    ("words", "argv"),
    [
        (["hostname"], ["hostname"]),
        (["nvidia-smi -L"], ["sh", "-c", "nvidia-smi -L"]),
        (["ps aux | grep python"], ["sh", "-c", "ps aux | grep python"]),
        (["echo $HOME"], ["sh", "-c", "echo $HOME"]),
        (["ls *.py"], ["sh", "-c", "ls *.py"]),
        (["a;b"], ["sh", "-c", "a;b"]),
        (["echo", "a b", "$(id)"], ["echo", "a b", "$(id)"]),
        (["sh", "-c", "exit 3"], ["sh", "-c", "exit 3"]),
    ],
)
def test_command_argv(words, argv):
    assert command_argv(words) == argv


def test_command_argv_empty():
    with pytest.raises(RemoteError) as err:
        command_argv([])
    assert "--" in err.value.fix


def _result(rc):
    return NodeResult(node="n", returncode=rc, stdout="", stderr="", duration_s=0.0, failure=None)


@pytest.mark.parametrize(
    ("codes", "worst"),
    [([], 0), ([0, 0], 0), ([0, 3, 1], 3), ([0, None], 124), ([None, 255], 255), ([0, -9], -9)],
)
def test_worst_returncode(codes, worst):
    assert worst_returncode([_result(c) for c in codes]) == worst


# ----------------------------------------------------------------------------- local runs


@pytest.fixture
def local():
    nodes = load_cluster().nodes
    assert all(n.is_local for n in nodes)
    return nodes


def test_run_local_captures_output_and_status(local):
    (result,) = run_on_nodes(local, ["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert (result.node, result.returncode) == ("localhost", 4)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.failure is Failure.COMMAND_FAILED and not result.ok
    assert result.reason() == "exit 4: err"


def test_run_local_delivers_stdin(local):
    # 2 MB: far more than a pipe buffer, so writing and reading must overlap.
    payload = b"".join(b"line %d \xc3\xa9\n" % i for i in range(200_000))
    (result,) = run_on_nodes(local, ["cat"], stdin=payload, timeout=30)
    assert result.ok and result.stdout == payload.decode()


def test_run_local_keeps_a_line_longer_than_64k(local):
    (result,) = run_on_nodes(
        local, ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo"], timeout=10
    )
    assert result.ok and result.stdout == "x" * 100_000 + "\n"


def test_run_local_timeout_kills_the_whole_group(local):
    start = time.monotonic()
    (result,) = run_on_nodes(local, ["sh", "-c", "sleep 30 & echo $!; wait"], timeout=0.5)
    elapsed = time.monotonic() - start
    assert result.failure is Failure.TIMED_OUT and result.returncode is None
    assert 0.4 < elapsed < 5
    child = int(result.stdout.split()[0])
    time.sleep(0.1)
    status = Path(f"/proc/{child}/status")
    # Gone, or a zombie waiting for a reaper: either way no longer running.
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_run_local_missing_executable(local):
    (result,) = run_on_nodes(local, ["/nonexistent/trainfleet-no-such-command"])
    assert result.returncode == 127 and result.failure is Failure.COMMAND_FAILED
    assert "No such file" in result.stderr


def test_run_local_streams_lines(local):
    seen = []
    run_on_nodes(
        local,
        ["sh", "-c", "echo a; echo b >&2; printf 'no newline'"],
        on_line=lambda node, stream, line: seen.append((node, stream, line)),
    )
    assert sorted(seen) == [
        ("localhost", "stderr", "b"),
        ("localhost", "stdout", "a"),
        ("localhost", "stdout", "no newline"),
    ]


def test_run_on_several_nodes_keeps_order_and_runs_at_once(tmp_path):
    nodes = load_cluster(hosts="localhost,127.0.0.1").nodes
    # Each node waits until both have started: run one after another, the first would time out.
    barrier = f"echo x >> {tmp_path}/started; until [ $(wc -l < {tmp_path}/started) -ge 2 ]; do"
    results = run_on_nodes(
        nodes, ["sh", "-c", f"{barrier} sleep 0.02; done; echo done"], timeout=10
    )
    assert [r.node for r in results] == ["localhost", "127.0.0.1"]
    assert [(r.ok, r.stdout) for r in results] == [(True, "done\n")] * 2


def test_the_ssh_control_directory_must_be_private(tmp_path, monkeypatch):
    """#17: /tmp/trainfleet-UID-ssh has a predictable name; one made by another user, open to
    others or a link would hand them this user's shared ssh connections."""
    from trainfleet.remote import control_dir

    mine = tmp_path / "mine"
    monkeypatch.setenv("TRAINFLEET_CONTROL_DIR", str(mine))
    assert control_dir() == mine and mine.stat().st_mode & 0o777 == 0o700
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(mine)
    for bad in (opened, link):
        monkeypatch.setenv("TRAINFLEET_CONTROL_DIR", str(bad))
        with pytest.raises(RemoteError, match="not this user's private directory") as err:
            control_dir()
        assert "TRAINFLEET_CONTROL_DIR" in err.value.fix


def test_a_32_mib_line_without_newline_is_cut_at_64_kib_with_a_note_and_the_rest_still_comes(
    local,
):
    """F8: `exec` streams lines; a node that writes 32 MiB with no newline got them whole,
    re-split for every 64 KiB read (quadratic time). Now the line is cut at the cap, the rest
    counted and dropped, and the note says how many bytes; the whole output is still kept."""
    seen = []
    write = "import sys; sys.stdout.write('x' * (32 << 20) + '\\nafter\\n')"
    (result,) = run_on_nodes(
        local,
        [sys.executable, "-c", write],
        on_line=lambda node, stream, line: seen.append((node, stream, line)),
    )
    cap = 64 * 1024
    assert [line for _, _, line in seen][0] == "x" * cap
    assert seen[1] == (
        "localhost",
        "stdout",
        f"trainfleet: {(32 << 20) - cap} more bytes of that line were dropped"
        f" (a line is cut at {cap} bytes)",
    )
    assert seen[2:] == [("localhost", "stdout", "after")]
    assert len(result.stdout) == (32 << 20) + len("\nafter\n")  # the result keeps it all
