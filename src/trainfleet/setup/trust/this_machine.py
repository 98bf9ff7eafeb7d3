"""This machine's side of `setup ssh`: its key, and the nodes' host keys in its known_hosts.

    >>> print(question(["  gpu-node-1: ssh-ed25519 SHA256:47DEQpj8HBSa"], []))  # doctest: +ELLIPSIS
    host keys offered by the nodes (compare with `ssh-keygen -lf ...` on each node's console):
      gpu-node-1: ssh-ed25519 SHA256:47DEQpj8HBSa
    trust these keys?

Which key and which known_hosts file are the ones ssh uses for each node: cluster.yaml's
`identity_file`/`known_hosts_file`, else what `ssh -G` says (~/.ssh/config included), else
~/.ssh/id_ed25519 (created) and ~/.ssh/known_hosts. The same `trainfleet.node.sshkeys` that
runs on the nodes runs here, in-process.
"""

from __future__ import annotations

from trainfleet.cluster import Cluster
from trainfleet.errors import SetupError
from trainfleet.node import sshkeys
from trainfleet.setup.result import THIS_MACHINE, Confirm, SetupResult
from trainfleet.setup.trust import hostkeys

CONSOLE_CHECK = "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"
"""How the user reads a node's real host key fingerprint, on a console that needs no ssh."""


def question(new: list[str], changed: list[str]) -> str:
    lines = []
    if new:
        lines += [
            f"host keys offered by the nodes (compare with `{CONSOLE_CHECK}` on each "
            "node's console):",
            *new,
        ]
    if changed:
        lines += ["CHANGED host keys (a reinstalled node, or someone in between):", *changed]
    lines.append("replace the old keys and trust the new ones?" if changed else "trust these keys?")
    return "\n".join(lines)


def _keys(views: dict[str, sshkeys.TrustAnswer], result: SetupResult) -> dict[str, str | None]:
    """This machine's public key for each node in `views`; created where missing (None: a dry
    run, which creates nothing)."""
    made: dict[str, str | None] = {}
    pubkeys: dict[str, str | None] = {}
    for host, view in views.items():
        path = view["identity"]
        if not view["key_missing"]:
            pubkeys[host] = view["pubkey"]
            continue
        if path not in made:
            if result.dry_run:
                result.add(THIS_MACHINE, f"would create key {path} (ed25519)")
                made[path] = None
            else:
                made[path] = sshkeys.main(sshkeys.job(identity=path, make_key=True))["pubkey"]
                result.add(THIS_MACHINE, f"created key {path} (ed25519)")
        pubkeys[host] = made[path]
    return pubkeys


def this_machine(
    cluster: Cluster,
    targets: dict[str, hostkeys.Target],
    result: SetupResult,
    confirm: Confirm,
    trusted_file: str | None,
) -> dict[str, str | None]:
    """Make this machine's key and known_hosts right; returns its public key per node (None:
    a dry run would create it)."""
    remote = [node for node in cluster.nodes if not node.is_local]  # localhost: no ssh, no key
    views = {}
    for node in remote:
        job = sshkeys.job(
            identity=node.ssh.identity_file,
            known_hosts=node.ssh.known_hosts_file,
            ssh_g=hostkeys.ssh_g_argv(node),
            lookup=targets[node.host].names,
            dry_run=True,
        )
        views[node.host] = sshkeys.main(job)
    new: list[str] = []
    changed: list[str] = []
    writes: dict[str, tuple[list[str], list[str]]] = {}
    for node in remote:
        target, known = targets[node.host], views[node.host]["known"]
        add, stale = hostkeys.plan_names(target.names, target.offered, known)
        if not add and not stale:
            continue
        # Every line is a question (a trusted key under a new name too), unless --known-hosts
        # FILE lists that key under that very name.
        vouched = hostkeys.vouched(trusted_file, add) if trusted_file else set()
        asked = [line for line in add if line not in vouched]
        asked_names = {line.split(" ", 1)[0] for line in asked}
        changed += hostkeys.describe_changed(
            THIS_MACHINE, target, {n: old for n, old in stale.items() if n in asked_names}
        )
        fresh = [line for line in asked if line.split(" ", 1)[0] not in stale]
        new += hostkeys.describe_new(target, fresh, known)
        remove, lines = writes.setdefault(views[node.host]["known_hosts"], ([], []))
        remove += list(stale)
        lines += add
    if new or changed:
        text = question(new, changed)
        if result.dry_run:
            result.note(text.rsplit("\n", 1)[0])
        elif not confirm(text, changed_keys=bool(changed)):
            raise SetupError(
                ("changed host keys were not confirmed" if changed else "host keys not trusted")
                + ": nothing was changed",
                f"compare the fingerprints with `{CONSOLE_CHECK}` on each node's console; if "
                "they match, run again and answer yes (or pass "
                + ("--replace-changed-host-keys" if changed else "--yes")
                + ", or --known-hosts FILE with the keys)",
            )
    pubkeys = _keys(views, result)  # only once the keys were accepted
    for path, (remove, lines) in writes.items():
        done = sshkeys.main(
            sshkeys.job(known_hosts=path, remove=remove, add_known=lines, dry_run=result.dry_run)
        )
        verb = "would add" if result.dry_run else "added"
        if done["removed"]:
            result.add(
                THIS_MACHINE, f"{path}: changed key(s) replaced for {', '.join(done['removed'])}"
            )
        if done["known_added"]:
            result.add(THIS_MACHINE, f"{path}: {verb} {done['known_added']} host key line(s)")
    return pubkeys
