"""The minimal firewall rule that lets the cluster's nodes reach each other over TCP, for the
firewall that is active on a node; pure functions of doctor's facts.

    >>> print(allow_rules("iptables", "ens14f0", ["10.0.0.12"])[0].text)
    iptables -I INPUT -i ens14f0 -s 10.0.0.12/32 -p tcp -m comment --comment trainfleet -j ACCEPT
    >>> allow_rules("ufw", "eth0", ["10.0.0.12"])[0].revert
    ('ufw', 'delete', 'allow', 'in', 'on', 'eth0', 'from', '10.0.0.12', 'to', 'any', 'proto', 'tcp')

One rule per peer node: TCP from that node's address, in on the data interface, accepted
ahead of the rules that drop (NCCL's and gloo's ports are random, so no port list is narrower
and still works). Every rule carries the comment `trainfleet`, and each has the exact command
that removes it again; `apply` records those (in `record`). A firewall is never disabled or
flushed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from trainfleet.doctor.facts import Firewall
from trainfleet.untrusted import valid_interface, valid_peer, valid_word

TAG = "trainfleet"
"""The comment on every rule setup adds: how a person (and --revert's checks) tell them apart."""
BACKENDS = ("iptables", "nftables", "ufw", "firewalld")


NFT_FAMILIES = ("ip", "ip6", "inet", "arp", "bridge", "netdev")


@dataclass(frozen=True, slots=True)
class Rule:
    backend: str
    apply: tuple[str, ...]
    """argv that adds the rule (nftables: it echoes the new rule's handle)."""
    revert: tuple[str, ...]
    """argv that removes exactly this rule (nftables: completed with the handle once known)."""
    peer: str

    @property
    def text(self) -> str:
        return shlex.join(a for a in self.apply if a not in ("--echo", "--handle"))

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "text": self.text,
            "peer": self.peer,
            "apply": list(self.apply),
            "revert": list(self.revert),
        }


@dataclass(frozen=True, slots=True)
class NftChain:
    family: str
    table: str
    chain: str
    filters: bool
    """Its policy is drop, or it holds a drop/reject rule."""


def nft_input_chains(ruleset: str) -> list[NftChain]:
    """Base chains on the input hook in `nft list ruleset` text."""
    chains: list[NftChain] = []
    table: tuple[str, str] | None = None
    chain: str | None = None
    hooked, filters = False, False

    def close() -> None:
        if table and chain and hooked:
            chains.append(NftChain(table[0], table[1], chain, filters))

    for raw in ruleset.splitlines():
        line = raw.strip()
        if m := re.match(r"table (\w+) (\S+) \{", line):
            if m.group(1) not in NFT_FAMILIES or not valid_word(m.group(2)):
                close()
                table, chain, hooked, filters = None, None, False, False
                continue
            close()
            table, chain, hooked, filters = (m.group(1), m.group(2)), None, False, False
        elif m := re.match(r"chain (\S+) \{", line):
            close()
            chain, hooked, filters = m.group(1), False, False
            if not valid_word(chain):
                chain = None
        elif chain and "hook input" in line:
            hooked = True
            filters = filters or "policy drop" in line
        elif chain and re.search(r"\b(drop|reject)\b", line):
            filters = True
    close()
    return chains


def _iptables_filters(rules: str) -> bool:
    """`iptables -S` output drops or rejects something on input."""
    return any(
        line.startswith(("-P INPUT DROP", "-A INPUT")) and ("DROP" in line or "REJECT" in line)
        for line in rules.splitlines()
    )


def active_backends(firewall: Firewall) -> list[str]:
    """The firewalls that filter input on a node, from doctor's `firewall` facts; ufw and
    firewalld manage the kernel's rules themselves, so when one of them is on, only it."""
    if firewall.ufw and firewall.ufw.out.startswith("Status: active"):
        return ["ufw"]
    if firewall.firewalld and firewall.firewalld.out.strip() == "running":
        return ["firewalld"]
    found = []
    iptables = firewall.iptables
    if iptables and iptables.rc == 0 and _iptables_filters(iptables.out):
        found.append("iptables")
    if nft_chains_to_open(firewall, skip_iptables="iptables" in found):
        found.append("nftables")
    return found


def nft_chains_to_open(firewall: Firewall, *, skip_iptables: bool) -> list[NftChain]:
    """Input chains that filter, except iptables-nft's own tables when iptables handles them
    (a packet must be accepted by every base chain on the hook)."""
    nft = firewall.nft
    if nft is None or nft.rc != 0:
        return []
    own = {("ip", "filter"), ("ip6", "filter")} if skip_iptables else set()
    return [c for c in nft_input_chains(nft.out) if c.filters and (c.family, c.table) not in own]


def _iptables(iface: str, peer: str, **_: object) -> list[Rule]:
    spec = ("-i", iface, "-s", f"{peer}/32", *"-p tcp -m comment --comment".split(), TAG)
    spec += ("-j", "ACCEPT")
    return [
        Rule(
            "iptables", ("iptables", "-I", "INPUT", *spec), ("iptables", "-D", "INPUT", *spec), peer
        )
    ]


def _nft_spec(iface: str, peer: str) -> tuple[str, ...]:
    return ("iifname", iface, "ip", "saddr", peer, *"meta l4proto tcp accept comment".split(), TAG)


def _nftables(iface: str, peer: str, *, chains: list[NftChain], **_: object) -> list[Rule]:
    spec = _nft_spec(iface, peer)
    rules = []
    for c in chains:
        where = (c.family, c.table, c.chain)
        add = ("nft", "--echo", "--handle", "insert", "rule", *where, *spec)
        rules.append(Rule("nftables", add, ("nft", "delete", "rule", *where, "handle"), peer))
    return rules


def _ufw(iface: str, peer: str, **_: object) -> list[Rule]:
    spec = ("allow", "in", "on", iface, "from", peer, *"to any proto tcp".split())
    return [
        Rule("ufw", ("ufw", "insert", "1", *spec, "comment", TAG), ("ufw", "delete", *spec), peer)
    ]


def _firewalld(iface: str, peer: str, *, zone: str | None, **_: object) -> list[Rule]:
    rich = (
        f'rule family="ipv4" source address="{peer}/32" port port="1-65535" protocol="tcp" accept'
    )
    target = ("firewall-cmd", *([f"--zone={zone}"] if zone else []))
    # Runtime and permanent, so that neither a reload nor a reboot loses it; each removed alike.
    return [
        Rule(
            "firewalld",
            (*target, *keep, f"--add-rich-rule={rich}"),
            (*target, *keep, f"--remove-rich-rule={rich}"),
            peer,
        )
        for keep in ((), ("--permanent",))
    ]


class _MakeRules(Protocol):
    """One backend's rules for TCP from `peer` in on `iface` (each reads what it needs)."""

    def __call__(
        self, iface: str, peer: str, *, chains: list[NftChain], zone: str | None
    ) -> list[Rule]: ...


_RULES: dict[str, _MakeRules] = {
    "iptables": _iptables,
    "nftables": _nftables,
    "ufw": _ufw,
    "firewalld": _firewalld,
}


def allow_rules(
    backend: str,
    iface: str,
    peers: list[str],
    *,
    chains: Sequence[NftChain] = (),
    zone: str | None = None,
) -> list[Rule]:
    """The rules for one node: TCP from each peer address, in on `iface`. `chains`: the
    nftables input chains to open; `zone`: firewalld's zone of `iface` (None: the default)."""
    if backend not in _RULES:
        raise ValueError(f"unknown firewall backend {backend!r}")
    return [
        rule
        for peer in peers
        for rule in _RULES[backend](iface, peer, chains=list(chains), zone=zone)
    ]


def revert_is_ours(backend: str, argv: list[str]) -> bool:
    """`argv` removes one rule `allow_rules` makes (optionally after `sudo -n`): what --revert
    checks each entry of a state file against before running it, so that an edited file runs
    nothing else."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return False
    argv = argv[2:] if argv[:2] == ["sudo", "-n"] else argv
    try:
        if backend == "nftables":
            family, table, chain = argv[3:6]
            return (
                argv[:3] == ["nft", "delete", "rule"]
                and len(argv) == 8
                and family in NFT_FAMILIES
                and valid_word(table)
                and valid_word(chain)
                and argv[6] == "handle"
                and (argv[7].isdigit() or argv[7] == "?")  # "?": nft printed no handle
            )
        if backend == "iptables":
            iface, peer = argv[4], argv[6].removesuffix("/32")
            expected = [r.revert for r in _iptables(iface, peer)]
        elif backend == "ufw":
            iface, peer = argv[5], argv[7]
            expected = [r.revert for r in _ufw(iface, peer)]
        elif backend == "firewalld":
            zone = argv[1].removeprefix("--zone=") if argv[1].startswith("--zone=") else None
            found = re.search(r'source address="([0-9.]+)/32"', argv[-1])
            iface, peer = "lo", found.group(1) if found else ""
            if zone is not None and not valid_word(zone):
                return False
            expected = [r.revert for r in _firewalld(iface, peer, zone=zone)]
        else:
            return False
    except (IndexError, ValueError):
        return False
    return valid_interface(iface) and valid_peer(peer) and tuple(argv) in expected


def nft_listed(text: str, where: list[str]) -> str | None:
    """How `nft list` prints the rule `allow_rules` added as `text` in chain `where` (family,
    table, chain), without its handle; None when `text` is not such a rule. What --revert looks
    for when nft printed no handle as it added the rule.

        >>> nft_listed("nft insert rule inet filter input iifname eth0 ip saddr 10.0.0.11 "
        ...            "meta l4proto tcp accept comment trainfleet", ["inet", "filter", "input"])
        'iifname "eth0" ip saddr 10.0.0.11 meta l4proto tcp accept comment "trainfleet"'
    """
    try:
        words = shlex.split(text)
        family, table, chain = where
        iface, peer = words[7], words[10]
    except (ValueError, IndexError):
        return None
    if not (family in NFT_FAMILIES and valid_word(table) and valid_word(chain)):
        return None
    if not (valid_interface(iface) and valid_peer(peer)):
        return None
    [rule] = _nftables(iface, peer, chains=[NftChain(family, table, chain, True)])
    if rule.text != text:
        return None
    spec = list(_nft_spec(iface, peer))
    spec[1], spec[-1] = f'"{iface}"', f'"{TAG}"'  # nft quotes the strings it prints
    return " ".join(spec)


def nft_handle(output: str) -> str | None:
    """The handle `nft --echo --handle insert rule ...` printed for the new rule."""
    match = re.search(r"# handle (\d+)", output)
    return match.group(1) if match else None


def already_present(backend: str, output: str) -> bool:
    """The tool did not add the rule because an identical one was there (then it is the
    user's, and --revert must not remove it)."""
    return backend in ("ufw", "firewalld") and (
        "Skipping adding existing rule" in output or "ALREADY_ENABLED" in output
    )
