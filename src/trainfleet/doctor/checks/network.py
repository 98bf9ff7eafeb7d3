"""Network checks: names, interfaces, ports, and what the firewall lets through (MTU, address
family and link speed: `transport.py`).

>>> check_firewall(survey)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable

from trainfleet.catalog import FindingId
from trainfleet.doctor import netsel
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import Active, ClientName, Interface, Listener, NodeFacts, Resolution
from trainfleet.doctor.findings import Finding, Severity

LOOPBACK_PREFIXES = ("127.", "::1")


def chosen_interfaces(survey: Survey) -> dict[str, str | None]:
    """The interface trainfleet sets per node: the one pinned in cluster.yaml (`interface:`),
    else the one that routes to the master."""
    return {
        host: survey.cluster.node(host).interface
        or netsel.chosen_interface(facts, survey.master_addr)
        for host, facts in survey.facts.items()
    }


def _firewall_rules(facts: NodeFacts) -> list[str]:
    """The lines of the node's iptables rules that drop or reject (evidence)."""
    rules = facts.firewall.iptables.out if facts.firewall.iptables else ""
    return [
        line
        for line in rules.splitlines()
        if ("DROP" in line or "REJECT" in line) and not line.startswith("-P OUTPUT")
    ][:4]


def _allow_rule(facts: NodeFacts, subnet: str | None) -> str:
    """The minimal rule that lets the cluster's nodes in, for whatever firewall is active."""
    source = subnet or "<cluster subnet>"
    firewall = facts.firewall
    if firewall.ufw and firewall.ufw.out.startswith("Status: active"):
        return f"`ufw allow from {source} proto tcp`"
    if firewall.firewalld and firewall.firewalld.out.strip() == "running":
        trusted = f"firewall-cmd --permanent --zone=trusted --add-source={source}"
        return f"`{trusted} && firewall-cmd --reload`"
    return f"`iptables -I INPUT -p tcp -s {source} -j ACCEPT` (and make it persistent)"


def check_firewall(survey: Survey) -> list[Finding]:
    """A peer's connect to a port a probe listens on that does not get through."""
    master_port = str(survey.cluster.master_port)
    chosen = chosen_interfaces(survey)
    blocked: dict[str, list[str]] = {}
    for src, facts in survey.facts.items():
        attempts = facts.active.tcp_last_attempt
        for dst, ports in facts.active.tcp.items():
            target = survey.facts[dst].active if dst in survey.facts else Active()
            listening = target.listen
            since, until = target.listen_since, target.listen_until
            for port, status in ports.items():
                if status in ("open", "late") or listening.get(port) != "listening":
                    continue
                last = attempts.get(dst, {}).get(port)
                outside = last and (
                    (since and last < since + 0.5) or (until and last > until - 0.5)
                )
                if status == "refused" and outside:
                    continue  # refused while the peer's probe was not listening: inconclusive
                blocked.setdefault(dst, []).append(f"{src} -> {dst}:{port} {status}")
    findings = []
    for dst, lines in blocked.items():
        facts = survey.facts[dst]
        ports_ok = [
            p
            for s in survey.facts.values()
            for p, st in s.active.tcp.get(dst, {}).items()
            if st == "open"
        ]
        what = "ports NCCL/gloo pick at random" + (
            f" (the master port {master_port} gets through, so rendezvous works and then hangs)"
            if master_port in ports_ok
            else ""
        )
        subnet = netsel.subnet_of(chosen.get(dst), netsel.ifaces_of(facts))
        rules = _firewall_rules(facts)
        findings.append(
            Finding(
                id=FindingId.FIREWALL_BLOCKS_PORTS,
                severity=Severity.ERROR,
                nodes=(dst,),
                evidence=[f"connections to {what} are dropped:", *lines[:6]]
                + [f"{dst} firewall: {rule}" for rule in rules],
                fix=f"on {dst}, allow TCP from the cluster nodes on the data interface: "
                f"{_allow_rule(facts, subnet)}; do not disable the firewall",
            )
        )
    return findings


def listeners_besides_probe(facts: NodeFacts) -> list[Listener]:
    """The node's listening sockets, but for the probe's own test listeners (which hold the
    master port and random ports while the facts are gathered)."""
    return [e for e in facts.listening if e.pid != facts.pid]


def check_port_in_use(survey: Survey) -> list[Finding]:
    master = survey.cluster.master
    facts = survey.facts.get(master)
    if facts is None:
        return []
    port = survey.cluster.master_port
    holders = [e for e in listeners_besides_probe(facts) if e.port == port]
    bind = facts.active.listen.get(str(port), "")
    if not holders and "in use" not in bind:
        return []
    owner = next((h for h in holders if h.pid), None)
    command = " ".join(((owner and owner.cmd) or "").split())
    command = command if len(command) <= 120 else command[:117] + "..."
    who = f"pid {owner.pid}: {command}" if owner else "a process this user cannot see"
    return [
        Finding(
            id=FindingId.PORT_IN_USE,
            severity=Severity.ERROR,
            nodes=(master,),
            evidence=[f"port {port} on {master} is held by {who}"],
            fix=(
                f"stop it (`kill {owner.pid}` on {master}) if it is a leftover run, "
                if owner
                else "stop that process, "
            )
            + "or set another `master_port` in cluster.yaml",
        )
    ]


def _multi_node(survey: Survey) -> bool:
    """Loopback and interface choice only matter when ranks talk across machines."""
    return len(survey.cluster.nodes) > 1


def check_hostnames(survey: Survey) -> list[Finding]:
    findings = []
    chosen = chosen_interfaces(survey)
    for host, facts in survey.facts.items():
        name = facts.hostname or ""
        resolved = facts.resolve.get(name, Resolution())
        addresses = resolved.addresses
        iface = chosen.get(host)
        if resolved.error is not None:
            findings.append(
                Finding(
                    id=FindingId.HOSTNAME_UNRESOLVABLE,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[
                        f"on {host}, its own name `{name}` does not resolve: {resolved.error}"
                    ],
                    fix=f"add `<address> {name}` to /etc/hosts on {host}",
                )
            )
        elif _multi_node(survey) and all(a.startswith(LOOPBACK_PREFIXES) for a in addresses):
            findings.append(
                Finding(
                    id=FindingId.HOSTNAME_LOOPBACK,
                    severity=Severity.ERROR,
                    nodes=(host,),
                    evidence=[
                        f"on {host}, its own name `{name}` resolves to {', '.join(addresses)}: "
                        "gloo binds there and peers get `Connection refused`"
                    ],
                    fix=f"set GLOO_SOCKET_IFNAME={iface or '<data interface>'} on {host}, or map "
                    f"`{name}` to its real address in {host}'s /etc/hosts",
                )
            )
        master_name = survey.cluster.master
        master = facts.resolve.get(master_name, Resolution())
        if master_name != name and master.error is not None:
            findings.append(
                Finding(
                    id=FindingId.HOSTNAME_UNRESOLVABLE,
                    severity=Severity.WARNING,
                    nodes=(host,),
                    evidence=[f"on {host}, the master's name `{master_name}` does not resolve"],
                    fix=f"use the master's address as MASTER_ADDR ({survey.master_addr}), or add "
                    f"it to /etc/hosts on {host}",
                )
            )
    return findings


MAPPED_NAME_SUFFIX = "-ipv4-mapped"


def mapped_name(host: str, address: str) -> str:
    """The /etc/hosts name of `address`'s IPv4-mapped form: one of its own, so that the node's
    name still resolves to its IPv4 address alone."""
    plain = host.isascii() and all(c.isalnum() or c in "-." for c in host)
    if host != address and plain and host[:1].isalpha() and len(host) <= 200:
        return host + MAPPED_NAME_SUFFIX
    return "ipv4-mapped-" + address.replace(".", "-")


def unnamed_mapped(survey: Survey) -> dict[str, dict[str, ClientName]]:
    """Per node, the IPv4-mapped addresses c10d looks up there that have no name (the master:
    its clients'; every other node: the master's), with what the lookup said."""
    found = {}
    for host, facts in survey.facts.items():
        if str(facts.ipv6_disabled).strip() == "1":
            continue  # c10d then listens and connects on IPv4 alone: plain addresses
        failed = {a: r for a, r in facts.client_names.items() if r.error is not None}
        if failed:
            found[host] = failed
    return found


def _wait_s(facts: NodeFacts, lookups: dict[str, ClientName]) -> float | None:
    """How long one failed lookup waits on the node: as measured when it ended within the
    probe's bound, else what its resolver settings make of a server that never answers."""
    ended = [r.seconds for r in lookups.values() if r.seconds is not None and "no answer" not in
             (r.error or "")]  # fmt: skip
    if ended:
        return max(ended)
    return facts.resolver.unanswered_s


LOOKUP_OPTIONS = "timeout:1 attempts:1"
"""RES_OPTIONS for the processes of a launch or of doctor's stack phase on a node whose resolver
does not answer the reverse lookups c10d makes there: a lookup that gets no answer then waits
glibc's floor, 1 s, instead of timeout x attempts per server (10 s with the defaults), and
nothing on the node changes; `setup hosts`' /etc/hosts lines end the wait."""


def mapped_lookup_wait(survey: Survey) -> tuple[float, str] | None:
    """The longest wait for a failed IPv4-mapped lookup, and its node (None: no such lookup,
    or none whose length is known). Each process that joins a launch waits for one."""
    waits = {host: _wait_s(survey.facts[host], lookups)
             for host, lookups in unnamed_mapped(survey).items()}  # fmt: skip
    known = {h: w for h, w in waits.items() if w is not None}
    if not known:
        return None
    slowest = max(known, key=lambda host: known[host])
    return known[slowest], slowest


def check_client_names(survey: Survey) -> list[Finding]:
    """The names of the IPv4-mapped addresses c10d looks up (its `err=-3` line, and a wait in
    every process that joins a launch)."""
    unnamed = unnamed_mapped(survey)
    if not unnamed:
        return []
    master = survey.cluster.master
    node_of = {address: host for host, address in survey.addresses.items() if address}
    evidence = []
    for host, lookups in unnamed.items():
        role = " (the master)" if host == master else ""
        for address, r in sorted(lookups.items()):
            late = (r.error or "").startswith("no answer")
            took = f" after {r.seconds:.1f} s" if (r.seconds or 0) >= 0.1 and not late else ""
            whose = node_of.get(address, "a client")
            evidence.append(f"on {host}{role}, ::ffff:{address} ({whose}) has no name: {r.error}"
                            f"{took}")  # fmt: skip
    cost = "each process that joins a launch waits for one such lookup"
    wait = mapped_lookup_wait(survey)
    if wait is not None and wait[0] >= 0.1:
        worst, slowest = wait
        cost += (
            f" (up to {worst:g} s, on {slowest}: {_resolver_text(survey.facts[slowest])}), a"
            f" torchrun launch twice in a row (its agent, then its ranks): about {2 * worst:g} s"
            " more to start"
        )
    evidence.append(
        "c10d names the other end of every store connection in that form (the master names its"
        " clients, every process the master as it connects); the first lookup that fails prints"
        " `The hostname of the client socket cannot be retrieved. err=-3` and ends lookups in"
        f" that process: {cost}"
    )
    lines = sum(len(lookups) for lookups in unnamed.values())
    host, lookups = next(iter(unnamed.items()))
    address = sorted(lookups)[0]
    example = f"`::ffff:{address} {mapped_name(node_of.get(address, address), address)}` on {host}"
    return [
        Finding(
            id=FindingId.HOSTNAME_UNRESOLVABLE,
            severity=Severity.WARNING,
            nodes=tuple(unnamed),
            evidence=evidence,
            fix=f"`trainfleet setup hosts` adds the {lines} /etc/hosts line(s), e.g. {example}"
            " (a name of its own for each: the node's own name would then also resolve to the"
            " IPv6 form); it records them and `--revert` removes exactly those. Or give the"
            " nodes a DNS server that answers. Until then `trainfleet launch` sets"
            f" RES_OPTIONS={LOOKUP_OPTIONS} for its processes there (glibc's floor: 1 s per"
            " lookup that gets no answer)",
        )
    ]


def _resolver_text(facts: NodeFacts) -> str:
    r = facts.resolver
    if not r.nameservers:
        return "no nameserver set: glibc asks 127.0.0.1"
    return f"{len(r.nameservers)} nameserver(s), {r.timeout} s x {r.attempts} tries each"


def _configured(survey: Survey, host: str, key: str) -> tuple[str, str] | None:
    """(value, where it comes from) of an interface variable for a node, if set anywhere."""
    node = survey.cluster.node(host)
    if node.interface:  # launch sets both variables from it, over any env value
        return node.interface, "cluster.yaml `interface:`"
    if key in node.env:
        return node.env[key], "cluster.yaml env"
    node_env = survey.facts[host].env
    if key in node_env:
        return node_env[key], f"{host}'s own environment"
    if key in survey.launch_env:
        return survey.launch_env[
            key
        ], "this machine's environment (DeepSpeed's runner exports NCCL_*)"
    return None


def check_interfaces(survey: Survey) -> list[Finding]:
    """The interface rules, node by node in the order below, then the one across nodes."""
    routed = {
        host: netsel.chosen_interface(facts, survey.master_addr)
        for host, facts in survey.facts.items()
    }
    rules = (_nccl_ifname_mismatch, _gloo_ifname_missing, _nccl_default_wrong, _pin_off_route,
             _virtual_route)  # fmt: skip
    findings = [
        finding
        for host in survey.facts
        for rule in rules
        if (finding := rule(survey, host, routed.get(host))) is not None
    ]
    counts = _gloo_count_mismatch(survey)
    return findings + ([counts] if counts else [])


def _usable_names(ifaces: Iterable[Interface]) -> str:
    """The node's usable interfaces but lo, for the evidence."""
    return ", ".join(i.name for i in ifaces if netsel.usable(i) and i.name != "lo")


def _nccl_ifname_mismatch(survey: Survey, host: str, routed: str | None) -> Finding | None:
    """NCCL_SOCKET_IFNAME, wherever it is set for the node, matches none of its interfaces."""
    nccl = _configured(survey, host, "NCCL_SOCKET_IFNAME")
    ifaces = netsel.ifaces_of(survey.facts[host])
    if not nccl or netsel.nccl_matches(nccl[0], ifaces):
        return None
    return Finding(
        id=FindingId.IFACE_MISMATCH,
        severity=Severity.ERROR,
        nodes=(host,),
        evidence=[
            f"NCCL_SOCKET_IFNAME={nccl[0]} (from {nccl[1]}) matches no interface "
            f"on {host}; it has {_usable_names(ifaces)}"
        ],
        fix=f"set it per node (on {host}: NCCL_SOCKET_IFNAME={routed}): "
        f"`interface: {routed}` on {host} in cluster.yaml (launch sets "
        "NCCL and gloo from it; `doctor --fix` writes it), or a prefix list that "
        "covers every node",
    )


def _gloo_ifname_missing(survey: Survey, host: str, routed: str | None) -> Finding | None:
    """GLOO_SOCKET_IFNAME names an interface the node does not have (gloo takes exact names)."""
    gloo = _configured(survey, host, "GLOO_SOCKET_IFNAME")
    ifaces = netsel.ifaces_of(survey.facts[host])
    missing = netsel.gloo_missing(gloo[0], ifaces) if gloo else []
    if not gloo or not missing:
        return None
    return Finding(
        id=FindingId.IFACE_MISMATCH,
        severity=Severity.ERROR,
        nodes=(host,),
        evidence=[
            f"GLOO_SOCKET_IFNAME={gloo[0]} (from {gloo[1]}): {host} has no "
            f"interface {', '.join(missing)} (it has {_usable_names(ifaces)}); gloo fails with "
            f"`Unable to find address for: {missing[0]}`"
        ],
        fix=f"gloo takes exact names: set it per node (on {host}: "
        f"GLOO_SOCKET_IFNAME={routed}): `interface: {routed}` "
        f"on {host} in cluster.yaml (`doctor --fix` writes it)",
    )


def _nccl_default_wrong(survey: Survey, host: str, routed: str | None) -> Finding | None:
    """NCCL_SOCKET_IFNAME unset on a multi-node cluster, and NCCL's own pick is not the
    interface that routes to the master."""
    if _configured(survey, host, "NCCL_SOCKET_IFNAME") is not None or not _multi_node(survey):
        return None
    default = netsel.nccl_default(netsel.ifaces_of(survey.facts[host]))
    if not routed or not default or default == routed:
        return None
    return Finding(
        id=FindingId.IFACE_WRONG,
        severity=Severity.WARNING,
        nodes=(host,),
        evidence=[
            f"NCCL_SOCKET_IFNAME is unset: NCCL would use {default}, but "
            f"{host} reaches the master through {routed}"
        ],
        fix=f"NCCL_SOCKET_IFNAME={routed} on {host} (per node env)",
    )


def _pin_off_route(survey: Survey, host: str, routed: str | None) -> Finding | None:
    """cluster.yaml pins an interface the node has, but not the one that routes to the
    master."""
    pinned = survey.cluster.node(host).interface
    exists = not netsel.gloo_missing(pinned or "", netsel.ifaces_of(survey.facts[host]))
    if not (pinned and exists and routed and pinned != routed):
        return None
    return Finding(
        id=FindingId.IFACE_WRONG,
        severity=Severity.WARNING,
        nodes=(host,),
        evidence=[
            f"cluster.yaml pins interface {pinned} on {host}, but {host} reaches "
            f"the master through {routed}"
        ],
        fix=f"interface: {routed} for {host} in cluster.yaml, unless "
        f"{pinned} is a faster network that also reaches every node",
    )


def _virtual_route(survey: Survey, host: str, routed: str | None) -> Finding | None:
    """The node reaches the master through a virtual interface (docker, a bridge, a VPN)."""
    if not routed or not netsel.is_virtual(routed):
        return None
    return Finding(
        id=FindingId.IFACE_WRONG,
        severity=Severity.WARNING,
        nodes=(host,),
        evidence=[f"{host} reaches the master through {routed}, a virtual interface"],
        fix="check the master address and routes: use the data network",
    )


def _gloo_count_mismatch(survey: Survey) -> Finding | None:
    """GLOO_SOCKET_IFNAME lists a different number of interfaces on some nodes (every process
    must list the same number)."""
    counts = {
        host: len(gloo[0].split(","))
        for host in survey.facts
        if (gloo := _configured(survey, host, "GLOO_SOCKET_IFNAME"))
    }
    if len(set(counts.values())) <= 1:
        return None
    return Finding(
        id=FindingId.IFACE_MISMATCH,
        severity=Severity.ERROR,
        nodes=tuple(counts),
        evidence=[f"GLOO_SOCKET_IFNAME lists {n} interface(s) on {h}" for h, n in counts.items()],
        fix="every process must list the same number of interfaces in GLOO_SOCKET_IFNAME",
    )
