"""`trainfleet setup firewall`: print, apply (and record) or revert the rules of `firewall`.

    >>> rules, notes = plan_rules(survey, ["gpu-node-1"], zones={})  # doctest: +SKIP

Where doctor finds TCP between nodes dropped (firewall-blocks-ports), each such node gets one
rule per peer for its active firewall. `--apply` shows them, asks, adds them one by one and
records each in the state file with the exact command that removes it (for nftables, with
the handle the kernel gave it) right after it was added, so that `--revert` removes exactly
what was added, also after a partial failure, and nothing else: a rule that was already
there is never recorded, a rule that is gone already is only noted.

A rule opens a node only to the addresses its peers are known by on this machine: the names the
cluster file gives them (addresses, or names resolved here) and the addresses ssh connects to
(`ssh -G`'s HostName, resolved here). An address a node reports for its data interface is its
own word; outside that set it gets no rule, only a note naming the node and the address.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster, Node
from trainfleet.doctor import netsel
from trainfleet.doctor.checks.network import chosen_interfaces
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import NodeFacts
from trainfleet.errors import SetupError
from trainfleet.remote import run_on_nodes
from trainfleet.setup import verify
from trainfleet.setup.firewall.record import (
    RuleEntry,
    default_state_file,
    load_state,
    revert_rules,
    run_in_turn,
    save_state,
)
from trainfleet.setup.firewall.ruleset import (
    Rule,
    active_backends,
    allow_rules,
    already_present,
    nft_chains_to_open,
    nft_handle,
)
from trainfleet.setup.result import Confirm, SetupResult
from trainfleet.untrusted import valid_interface, valid_peer, valid_word

TIMEOUT_S = 30


def _address(facts: NodeFacts, iface: str | None) -> str | None:
    for entry in netsel.ifaces_of(facts):
        if entry.name == iface and entry.ipv4:
            return entry.ipv4[0].split("/")[0]
    return None


def trusted_addresses(
    cluster: Cluster, connected: Mapping[str, str | None], resolved: Mapping[str, Sequence[str]]
) -> dict[str, frozenset[str]]:
    """Per node, the IPv4 addresses a rule may let in as that node: its name in the cluster
    file when that is an address, what this machine resolves the name to (`resolved`), and the
    address ssh connects to (`connected`: `Survey.addresses`). Never what the node reports.

        >>> from trainfleet.cluster import load_cluster
        >>> cluster = load_cluster(hosts="10.0.0.11,gpu-node-2")
        >>> trusted = trusted_addresses(cluster, {"gpu-node-2": "10.0.0.12"},
        ...                             {"gpu-node-2": ["10.1.0.12", "::1"]})
        >>> sorted(trusted["10.0.0.11"]), sorted(trusted["gpu-node-2"])
        (['10.0.0.11'], ['10.0.0.12', '10.1.0.12'])
    """
    trusted = {}
    for node in cluster.nodes:
        known = {node.host, connected.get(node.host), *resolved.get(node.host, ())}
        trusted[node.host] = frozenset(a for a in known if a and valid_peer(a))
    return trusted


def resolve_names(cluster: Cluster) -> dict[str, list[str]]:
    """Every IPv4 address this machine resolves each node's name in the cluster file to (no
    connection is made; a name that does not resolve has none)."""
    found = {}
    for node in cluster.nodes:
        try:
            infos = socket.getaddrinfo(node.host, None, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            infos = []
        # AF_INET's sockaddr is (host, port); the type of a sockaddr admits other families' ints.
        addresses = (info[4][0] for info in infos)
        found[node.host] = sorted({a for a in addresses if isinstance(a, str)})
    return found


def plan_rules(
    survey: Survey,
    blocked: Sequence[str],
    zones: dict[str, str],
    *,
    resolved: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, list[Rule]], list[str]]:
    """The rules for each blocked node, and notes for those no rule can be found for. A peer's
    address gets a rule only when it is one `trusted_addresses` knows that peer by (`resolved`:
    `resolve_names`; without it, only the addresses ssh connects to and literal addresses)."""
    chosen = chosen_interfaces(survey)
    trusted = trusted_addresses(survey.cluster, survey.addresses, resolved or {})
    rules, notes = {}, []
    for host in blocked:
        facts = survey.facts[host]
        iface = chosen.get(host)
        if not valid_interface(iface):
            notes.append(
                f"{host}: TCP to it is dropped, but it has no interface with a route to the"
                f" master that a rule could name (found {iface!r}); no rule for it"
            )
            continue
        peers = []
        for peer, sheet in survey.facts.items():
            address = _address(sheet, chosen.get(peer)) if peer != host else None
            if not address:
                continue
            if not valid_peer(address):  # what a node reports is its own word: never `any`
                notes.append(
                    f"{peer} reports {address[:60]!r} as its address, which is not a unicast"
                    f" IPv4 address: no rule on {host} lets it in"
                )
            elif address not in trusted.get(peer, ()):  # nor an address it picked
                known = ", ".join(sorted(trusted.get(peer, ()))) or "none"
                notes.append(
                    f"{peer} reports {address} as its address, which is not one this machine"
                    f" knows it by ({known}): no rule on {host} lets it in; if it is {peer}'s,"
                    " name the node by it in the cluster file (or make its name resolve to it"
                    " here), or add the rule by hand"
                )
            else:
                peers.append(address)
        backends = active_backends(facts.firewall)
        if not backends:
            notes.append(
                f"{host}: TCP to it is dropped, but no iptables/nftables/ufw/firewalld "
                "rule that drops was readable there (not root?), or the filter is "
                "outside the node (a cloud security group)"
            )
            continue
        chains = nft_chains_to_open(facts.firewall, skip_iptables="iptables" in backends)
        rules[host] = [
            rule
            for backend in backends
            for rule in allow_rules(backend, iface, peers, chains=chains, zone=zones.get(host))
        ]
    return rules, notes


def _firewalld_zones(cluster: Cluster, survey: Survey, blocked: list[str]) -> dict[str, str]:
    chosen = chosen_interfaces(survey)
    hosts = [h for h in blocked if "firewalld" in active_backends(survey.facts[h].firewall)]
    if not hosts:
        return {}
    argv = {h: ["firewall-cmd", f"--get-zone-of-interface={chosen[h]}"] for h in hosts}
    results = run_on_nodes([cluster.node(h) for h in hosts], argv, timeout=TIMEOUT_S)
    zones = {r.node: r.stdout.strip() for r in results if r.ok}
    return {host: zone for host, zone in zones.items() if valid_word(zone)}


def sudo_prefixes(nodes: Sequence[Node]) -> dict[str, list[str]]:
    """`sudo -n` for nodes where the ssh user is not root (firewall tools and /etc/hosts need
    root)."""
    results = run_on_nodes(nodes, ["id", "-u"], timeout=TIMEOUT_S)
    return {r.node: [] if r.stdout.strip() == "0" else ["sudo", "-n"] for r in results}


def apply_rules(
    cluster: Cluster, rules: dict[str, list[Rule]], state_file: str, result: SetupResult
) -> None:
    state = load_state(state_file)
    state["cluster"] = cluster.source
    sudo = sudo_prefixes([cluster.node(h) for h in rules])
    argvs = {h: [sudo[h] + list(r.apply) for r in rs] for h, rs in rules.items()}
    failed = []
    for i, results in run_in_turn(cluster, argvs):
        for r in results:
            rule = rules[r.node][i]
            if not r.ok:
                failed.append(f"{r.node}: `{rule.text}`: {r.reason()}")
                argvs[r.node] = argvs[r.node][: i + 1]  # stop there on that node
                continue
            if already_present(rule.backend, r.stdout + r.stderr):
                result.note(
                    f"{r.node}: already there (not recorded, so never removed): {rule.text}"
                )
                continue
            revert = list(rule.revert)
            if rule.backend == "nftables":
                handle = nft_handle(r.stdout)
                revert.append(handle or "?")  # --revert then looks for the rule itself
                if handle is None:
                    result.note(
                        f"{r.node}: nft printed no handle for `{rule.text}`: --revert looks"
                        " for it by its comment and match, or says to remove it by hand"
                    )
            entry = RuleEntry(
                backend=rule.backend, text=rule.text, peer=rule.peer, revert=sudo[r.node] + revert
            )
            state["nodes"].setdefault(r.node, []).append(entry)
            save_state(state_file, state)  # recorded at once: a failure later loses nothing
            result.add(r.node, f"added ({rule.backend}): {rule.text}")
    if failed:
        raise SetupError(
            "; ".join(failed),
            f"what was added is recorded in {state_file}; "
            "`trainfleet setup firewall --revert` removes it",
        )


def setup_firewall(
    cluster: Cluster,
    *,
    mode: str,
    state_file: str | None = None,
    cluster_in: str | None = None,
    confirm: Confirm,
    dry_run: bool = False,
) -> SetupResult:
    """mode 'print': the rules that doctor's findings call for; 'apply': add them after
    `confirm`; 'revert': remove what 'apply' recorded. Ends with doctor's firewall check."""
    state_file = state_file or default_state_file(cluster_in)
    result = SetupResult(step="firewall", dry_run=dry_run)
    if mode == "revert":
        result.fail_at = None  # the finding is expected back: it is what --revert restores
        if dry_run:
            for host, items in load_state(state_file, must_exist=True)["nodes"].items():
                for item in items:
                    result.add(host, f"would remove ({item['backend']}): {item['text']}")
        else:
            revert_rules(cluster, state_file, result)
    else:
        survey = verify.survey(cluster, verify.FIREWALL)
        found = verify.findings(survey, verify.FIREWALL)
        blocked = [h for f in found if f.id is FindingId.FIREWALL_BLOCKS_PORTS for h in f.nodes]
        zones = _firewalld_zones(cluster, survey, blocked)
        resolved = resolve_names(cluster) if blocked else {}
        rules, notes = plan_rules(survey, blocked, zones, resolved=resolved)
        result.notes += notes
        shown = [f"  {host}: {rule.text}" for host, rs in rules.items() for rule in rs]
        if mode == "print" or dry_run:
            result.dry_run = True  # printing the rules is what a dry run of --apply shows
            for host, host_rules in rules.items():
                for rule in host_rules:
                    result.add(host, f"would add ({rule.backend}): {rule.text}")
            if rules and mode == "print":
                result.note(
                    f"`--apply` adds them (recorded in {state_file}); `--revert` "
                    "removes exactly those"
                )
        elif rules:
            question = "\n".join(["firewall rules to add (TCP from the other nodes only):", *shown])
            if not confirm(question + "\nadd them?"):
                raise SetupError(
                    "the firewall rules were not confirmed; nothing was changed",
                    "run again and answer yes, or pass --yes",
                )
            apply_rules(cluster, rules, state_file, result)
        if mode == "print" or dry_run or not rules:
            result.checks, result.findings = [verify.FIREWALL.label], found
            return result
    survey = verify.survey(cluster, verify.FIREWALL)
    result.checks = [verify.FIREWALL.label]
    result.findings = verify.findings(survey, verify.FIREWALL)
    return result
