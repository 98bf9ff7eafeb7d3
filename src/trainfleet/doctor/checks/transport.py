"""Transport checks between the nodes: one MTU on the path, one address family for the master,
and no link far slower than the others.

>>> check_slow_link(survey)  # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter

from trainfleet.catalog import FindingId
from trainfleet.doctor import netsel
from trainfleet.doctor.checks.network import chosen_interfaces
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import Resolution
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.nodeset import fold_names


def check_mtu(survey: Survey) -> list[Finding]:
    chosen = chosen_interfaces(survey)
    mtus = {}
    for host, facts in survey.facts.items():
        for iface in netsel.ifaces_of(facts):
            if iface.name == chosen.get(host):
                mtus[host] = iface.mtu
    if len(set(mtus.values())) <= 1:
        return []
    common, _ = Counter(mtus.values()).most_common(1)[0]
    odd = [h for h, m in mtus.items() if m != common]
    return [
        Finding(
            id=FindingId.MTU_MISMATCH,
            severity=Severity.ERROR,
            nodes=tuple(odd),
            evidence=[f"{h}: {chosen[h]} mtu {mtus[h]}" for h in odd]
            + [f"{fold_names(h for h in mtus if h not in odd)}: mtu {common}"],
            fix=f"use the same MTU end to end (`ip link set {chosen[odd[0]]} mtu {common}` on "
            f"{odd[0]}, and on the switch): small collectives pass, large ones hang",
        )
    ]


def check_ipv6(survey: Survey) -> list[Finding]:
    findings = []
    master_name = survey.cluster.master
    for host, facts in survey.facts.items():
        addresses = facts.resolve.get(master_name, Resolution()).addresses
        if addresses and all(":" in a for a in addresses):
            findings.append(
                Finding(
                    id=FindingId.IPV6_MISMATCH,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[
                        f"on {host}, `{master_name}` resolves only to IPv6: {', '.join(addresses)}"
                    ],
                    fix=f"pass the master's IPv4 address ({survey.master_addr}) as MASTER_ADDR and "
                    "NCCL_SOCKET_FAMILY=AF_INET",
                )
            )
    return findings


SLOW_FACTOR = 10
"""A link this many times slower than the median of the other links is named (a shaped link in
the sandbox is ~200x slower; CPU contention on 2 shared cores makes healthy ones differ ~5x)."""


def link_rates(survey: Survey) -> dict[tuple[str, str], float]:
    """MB/s per (sender, receiver) from the ring bandwidth test, as the receivers measured."""
    rates = {}
    for dst, facts in survey.facts.items():
        for src, sample in facts.active.bandwidth_in.items():
            if sample.seconds > 0:
                rates[(src, dst)] = sample.bytes / sample.seconds / 1e6
    return rates


def check_slow_link(survey: Survey) -> list[Finding]:
    rates = link_rates(survey)
    if len(rates) < 3:
        return []  # nothing to compare with

    def median_of_others(link: tuple[str, str]) -> float:
        others = sorted(r for other, r in rates.items() if other != link)
        return others[len(others) // 2]

    slow = {link: r for link, r in rates.items() if r * SLOW_FACTOR < median_of_others(link)}
    if not slow:
        return []
    ordered = sorted(rates.values())
    median = ordered[len(ordered) // 2]
    ends = Counter(node for link in slow for node in link)
    # A slow node slows both its ring links; one slow link alone names both of its ends.
    named = [n for n, count in ends.items() if count >= 2] or sorted(ends)
    return [
        Finding(
            id=FindingId.SLOW_LINK,
            severity=Severity.WARNING,
            nodes=tuple(named),
            evidence=[f"{src} -> {dst}: {rate:.1f} MB/s" for (src, dst), rate in slow.items()]
            + [f"median of all {len(rates)} links: {median:.1f} MB/s"],
            fix=f"check {fold_names(named)}'s link: speed and duplex (`ethtool IFACE`), cabling, "
            "traffic shaping (`tc qdisc show`); `trainfleet commtest` measures it in full",
        )
    ]
