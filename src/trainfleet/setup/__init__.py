"""`trainfleet setup` and `trainfleet sync`: make fresh servers into a cluster doctor passes.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.setup.trust import setup_ssh
    >>> result = setup_ssh(load_cluster(cluster_file="cluster.yaml"),  # doctest: +SKIP
    ...                    confirm=lambda text: True, password=lambda nodes: "secret")

One module per concern: `trust` (ssh between every pair of nodes, with `launchside`,
`hostkeys`, `askpass`; its node side is `trainfleet.node.sshkeys`), `hostfile`, `env`,
`firewall` (rules per backend) with `fwapply` (apply, record, revert), `sync` (code to every
node), `verify` (the doctor checks that end every step) and `result` (what changed, rendered
and as JSON);
`trainfleet.clusterfile` edits cluster.yaml, for `doctor --fix` too. Every step computes what
to change from facts, changes only that, and ends with the doctor checks that match it;
`dry_run` prints the changes only.
"""
