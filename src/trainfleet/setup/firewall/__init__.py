"""`trainfleet setup firewall`: the one rule that lets the nodes reach each other, for the
firewall active on each node.

`ruleset` computes the rules from doctor's facts (pure functions); `apply` prints, applies or
reverts them; `record` is what `--apply` added, per node, so that `--revert` removes exactly that.
"""
