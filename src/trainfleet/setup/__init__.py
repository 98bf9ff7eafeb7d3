"""`trainfleet setup` and `trainfleet sync`: make fresh servers into a cluster doctor passes.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.setup.trust.step import setup_ssh
    >>> result = setup_ssh(load_cluster(cluster_file="cluster.yaml"),  # doctest: +SKIP
    ...                    confirm=lambda text: True, password=lambda nodes: "secret")

One module or package per step (`steps.STEPS` is their order): `trust` (`setup ssh`),
`hostfile`, `env`, `pyenv`, `firewall`, `etchosts` (`setup hosts`) and `sync`; a step with
several parts is a package whose `step` module runs it (`apply` for the firewall).
Shared by every step: `steps` (the table), `every` (all of them in order), `verify` (the doctor
checks that end every step), `clusteryaml` (the cluster.yaml a step edits) and `result` (what
changed, rendered and as JSON). `trainfleet.clusterfile` edits cluster.yaml, for `doctor --fix`
too.

Every step computes what to change from facts, changes only that, and ends with the doctor
checks that match it; `dry_run` prints the changes only.
"""
