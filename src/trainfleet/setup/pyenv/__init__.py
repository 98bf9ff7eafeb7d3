"""`trainfleet setup pyenv`: this machine's training environment on every node, same versions,
no index needed on the nodes.

`step` runs it; `wheels` gathers this machine's packages as wheel files and says which nodes can
take them; `dsops` builds DeepSpeed's JIT ops once and copies them. The node side is
`trainfleet.node.pyenv` and `trainfleet.node.dsops`.
"""
