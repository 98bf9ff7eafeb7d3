"""`trainfleet setup ssh`: this machine and every node trust every node, each itself included.

    >>> from trainfleet.doctor.facts import Active, NodeFacts, SshOutcome
    >>> denied = "u@10.0.0.12: Permission denied (password)."
    >>> facts = {"gpu-node-1": NodeFacts(active=Active(ssh={
    ...     "gpu-node-1": SshOutcome(rc=0), "gpu-node-2": SshOutcome(rc=255, stderr=denied)}))}
    >>> auth_pairs(facts, ["gpu-node-1", "gpu-node-2"]), auth_pairs(facts, ["gpu-node-1"])
    ([('gpu-node-1', 'gpu-node-2')], [])

Facts, then decisions, then changes, then doctor's ssh checks:

1. this machine's key (created when missing); every node's host keys (ssh-keyscan), shown with
   their fingerprints and confirmed, then written to this machine's known_hosts under every
   name of the node (`hostkeys`);
2. this machine logs in to each node; where its key is not accepted yet, the password (asked
   once) installs it, then is forgotten (`askpass`);
3. every node's known_hosts gets every node's keys under every name;
4. doctor's N x N matrix (every node to every node, itself included): for each pair that
   fails on authentication, the source's key (created where missing) goes into the target's
   ~/.ssh/authorized_keys. What works is not touched, so a second run changes nothing;
5. doctor's ssh checks, on fresh facts.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor

from trainfleet.catalog import FindingId
from trainfleet.cluster import Cluster
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.facts import NodeFacts
from trainfleet.doctor.findings import Severity
from trainfleet.errors import SetupError
from trainfleet.node import sshkeys
from trainfleet.nodeset import fold_names
from trainfleet.remote import Failure, classify, run_on_nodes
from trainfleet.setup import verify
from trainfleet.setup.result import Confirm, SetupResult
from trainfleet.setup.trust import askpass, hostkeys
from trainfleet.setup.trust.keyjobs import JOB_ARGV, JOB_TIMEOUT_S, job_line, node_job, run_jobs
from trainfleet.setup.trust.this_machine import this_machine
from trainfleet.untrusted import valid_name

Password = Callable[[list[str]], str]
"""password(nodes that need it) -> the password; raises SetupError when none can be had."""


def auth_pairs(facts: Mapping[str, NodeFacts], hosts: Collection[str]) -> list[tuple[str, str]]:
    """(source, target) pairs of doctor's N x N matrix that failed on authentication. A target
    is one of the cluster's `hosts`: a name a node's report adds is its word, no key's home."""
    pairs = []
    for src, sheet in facts.items():
        for dst, outcome in sheet.active.ssh.items():
            if dst not in hosts:
                continue
            failure = classify(outcome.rc, outcome.stderr, outcome.rc == 124, True)
            if failure is Failure.AUTH:
                pairs.append((src, dst))
    return pairs


# ----------------------------------------------------------------------------- step 2


def _log_in(
    cluster: Cluster,
    targets: dict[str, hostkeys.Target],
    pubkeys: dict[str, str | None],
    result: SetupResult,
    password: Password,
) -> dict[str, str] | None:
    """Each node's own hostname once this machine can log in (None: dry run, cannot yet)."""
    results = run_on_nodes(cluster.nodes, ["hostname"], timeout=JOB_TIMEOUT_S)
    need = [r.node for r in results if r.failure is Failure.AUTH]
    hostkey = [r for r in results if r.failure.pitfall_id is FindingId.SSH_HOSTKEY_UNKNOWN]
    other = [r for r in results if not r.ok and r.node not in need and r not in hostkey]
    if other or (hostkey and not result.dry_run):
        bad = other or hostkey
        raise SetupError(
            "; ".join(f"{r.node}: {r.reason()}" for r in bad), bad[0].failure.fix(bad[0].node)
        )
    if result.dry_run and (need or hostkey):
        for host in need:
            result.add(host, "would get this machine's key (the password is asked once)")
        result.note("the node-side steps are planned once this machine can log in everywhere")
        return None
    if need:
        nodes = [cluster.node(h) for h in need]
        proxied = [h for h in need if targets[h].proxied]
        if proxied:
            raise SetupError(
                f"{fold_names(proxied)} is reached through a ProxyJump/ProxyCommand: its ssh"
                " child would offer the one-time password to the jump host as well",
                "install this machine's key there another way (ssh-copy-id NODE), then run"
                " `trainfleet setup ssh` again",
            )
        secret = password(need)
        here = socket.gethostname()
        stdin = {
            h: job_line(sshkeys.job(authorize=[f"{pubkeys[h]} trainfleet-setup:{here}"]))
            for h in need
        }
        copied = askpass.run_with_password(nodes, JOB_ARGV, stdin, secret)
        del secret
        refused = [r for r in copied if not r.ok]
        if refused:
            raise SetupError(
                "; ".join(f"{r.node}: {r.reason()}" for r in refused),
                "check the password and that sshd there allows password logins "
                "(PasswordAuthentication or KbdInteractiveAuthentication yes)",
            )
        again = run_on_nodes(nodes, ["hostname"], timeout=JOB_TIMEOUT_S)
        still = [r for r in again if not r.ok]
        if still:
            raise SetupError(
                f"{fold_names(r.node for r in still)} still refuse(s) this machine's key after "
                f"it was added to ~/.ssh/authorized_keys ({still[0].reason()})",
                "check sshd's AuthorizedKeysFile there, and that ~ and ~/.ssh are writable "
                "only by their owner (sshd's StrictModes)",
            )
        for host in need:
            result.add(
                host,
                "this machine's key added to ~/.ssh/authorized_keys (password used once, not kept)",
            )
        results = [r for r in results if r.ok] + again
    return {r.node: r.stdout.strip() for r in results}


def _own_hostnames(
    hostnames: Mapping[str, str], targets: dict[str, hostkeys.Target], result: SetupResult
) -> None:
    """Each node's own hostname becomes a name of its key where `own_hostname_refused` finds
    nothing against it; else a note says why not. Root on a node sets its hostname: `*` would
    trust its key for every host, `gpu-node-1` or `github.com` would let it stand in for them."""
    here = {socket.gethostname().lower()}
    new = sorted(
        {
            name
            for host, name in hostnames.items()
            if valid_name(name) and name.lower() not in map(str.lower, targets[host].bare_names)
        }
    )
    with ThreadPoolExecutor(max_workers=16) as pool:  # a resolver that does not answer waits
        resolved = dict(zip(new, pool.map(hostkeys.ipv4s, new), strict=True))
    for host, name in hostnames.items():
        target = targets[host]
        others = [t for h, t in targets.items() if h != host]
        why = hostkeys.own_hostname_refused(
            name, target, others, this_machine=here, resolve=lambda n: resolved.get(n, set())
        )
        if why is None:
            target.machine_hostname = name
            continue
        if why.startswith("resolves here"):
            fix = "reach it by a name in the cluster spec, or give that name an /etc/hosts "
            fix += "entry or DNS record here for its address"
        elif why.startswith("is a name of"):
            fix = "check that node: two machines with one name, or one claiming another's"
        else:
            fix = "set a plain name there with hostnamectl"
        result.note(
            f"{host} says its hostname is {name[:80]!r}, which {why}: its key is not"
            f" trusted under that name ({fix})"
        )


# ----------------------------------------------------------------------------- step 3


def _node_known_hosts(
    cluster: Cluster, targets: dict[str, hostkeys.Target], result: SetupResult, confirm: Confirm
) -> dict[str, sshkeys.TrustAnswer]:
    """Every node's known_hosts holds every node under every name; returns each node's view."""
    names = [name for target in targets.values() for name in target.names]
    views = run_jobs(
        cluster.nodes, {n.host: node_job(n, lookup=names, dry_run=True) for n in cluster.nodes}
    )
    plans: dict[str, tuple[list[str], list[str]]] = {}
    changed: list[str] = []
    for host, view in views.items():
        add: list[str] = []
        remove: list[str] = []
        for target in targets.values():
            lines, stale = hostkeys.plan_names(target.names, target.offered, view["known"])
            add += lines
            remove += list(stale)
            changed += hostkeys.describe_changed(host, target, stale)
        if add or remove:
            plans[host] = (add, remove)
    if changed and not result.dry_run:
        question = "\n".join(["changed host keys in the nodes' known_hosts:", *changed])
        if not confirm(question + "\nreplace the old keys with the new ones?", changed_keys=True):
            raise SetupError(
                "changed host keys were not confirmed; nothing was replaced",
                "check the fingerprints, then run again and answer yes (or pass"
                " --replace-changed-host-keys)",
            )
    jobs: dict[str, sshkeys.TrustJob] = {
        host: sshkeys.job(
            known_hosts=views[host]["known_hosts"],
            remove=remove,
            add_known=add,
            dry_run=result.dry_run,
        )
        for host, (add, remove) in plans.items()
    }
    done = run_jobs([cluster.node(h) for h in jobs], jobs)
    for host, outcome in done.items():
        verb = "would add" if result.dry_run else "added"
        if outcome["removed"]:
            result.add(
                host,
                f"{outcome['known_hosts']}: changed key(s) replaced for "
                f"{', '.join(outcome['removed'])}",
            )
        if outcome["known_added"]:
            result.add(
                host, f"{outcome['known_hosts']}: {verb} {outcome['known_added']} host key line(s)"
            )
    return views


# ----------------------------------------------------------------------------- step 4


def _node_trust(
    cluster: Cluster, views: dict[str, sshkeys.TrustAnswer], result: SetupResult
) -> Survey:
    survey = verify.survey(cluster, verify.SSH, probe_python=verify.PROBE_PYTHON)
    pairs = auth_pairs(survey.facts, [node.host for node in cluster.nodes])
    if not pairs:
        return survey
    sources = sorted({src for src, _ in pairs}, key=[n.host for n in cluster.nodes].index)
    keyless = [cluster.node(s) for s in sources if views[s]["key_missing"]]
    verb = "would add" if result.dry_run else "added"
    if result.dry_run:
        for node in keyless:
            result.add(node.host, f"would create key {views[node.host]['identity']}")
    else:
        made = run_jobs(keyless, {n.host: node_job(n, make_key=True) for n in keyless})
        for host, outcome in made.items():
            views[host] = outcome
            result.add(host, f"created key {outcome['identity']}")
    by_target: dict[str, list[str]] = {}
    for src, dst in pairs:
        by_target.setdefault(dst, []).append(src)
    unreadable = [s for s in sources if not result.dry_run and not views[s]["pubkey"]]
    if unreadable:
        raise SetupError(
            f"{fold_names(unreadable)}: the ssh key there has no readable public key",
            "check the identity file's .pub beside it (`ssh-keygen -y -f KEY`)",
        )
    if not result.dry_run:
        jobs = {
            dst: sshkeys.job(authorize=[f"{views[s]['pubkey']} trainfleet-setup:{s}" for s in srcs])
            for dst, srcs in by_target.items()
        }
        run_jobs([cluster.node(d) for d in jobs], jobs)
    for dst, srcs in by_target.items():
        result.add(dst, f"~/.ssh/authorized_keys: {verb} the key(s) of {fold_names(srcs)}")
    if result.dry_run:
        return survey
    return verify.survey(cluster, verify.SSH, probe_python=verify.PROBE_PYTHON)


# ----------------------------------------------------------------------------- the step


def setup_ssh(
    cluster: Cluster,
    *,
    confirm: Confirm,
    password: Password,
    trusted_file: str | None = None,
    dry_run: bool = False,
) -> SetupResult:
    """Full ssh trust for `cluster`; see the module docstring for the steps."""
    result = SetupResult(step="ssh", dry_run=dry_run, fail_at=Severity.WARNING)
    targets = {node.host: hostkeys.target_of(node) for node in cluster.nodes}
    remote = [node.host for node in cluster.nodes if not node.is_local]  # localhost: no ssh
    with ThreadPoolExecutor(max_workers=16) as pool:  # each scan may wait its timeout
        offered = pool.map(hostkeys.scan, [targets[host] for host in remote])
        for host, keys in zip(remote, offered, strict=True):
            targets[host].offered = keys
    silent = [host for host in remote if not targets[host].offered]
    if silent:
        raise SetupError(
            f"{fold_names(silent)}: no host key from ssh-keyscan (nothing answers on its ssh "
            "port from here)",
            "check the address and port, that sshd runs there and that a firewall lets port 22 in",
        )
    pubkeys = this_machine(cluster, targets, result, confirm, trusted_file)
    hostnames = _log_in(cluster, targets, pubkeys, result, password)
    if hostnames is None:
        return result
    _own_hostnames(hostnames, targets, result)
    this_machine(cluster, targets, result, confirm, trusted_file)  # the nodes' own hostnames
    views = _node_known_hosts(cluster, targets, result, confirm)
    survey = _node_trust(cluster, views, result)
    result.checks = [verify.SSH.label]
    result.findings = verify.findings(survey, verify.SSH)
    return result
