"""A real multi-node cluster on one Linux machine: network namespaces, each with sshd.

    >>> from trainfleet import sandbox
    >>> box = sandbox.up(nodes=3, faults=["firewall-blocks-ports@1"])  # doctest: +SKIP
    >>> sandbox.down()  # doctest: +SKIP

For trainfleet's own tests, its demo, and for users who want to rehearse a multi-node launch
before paying for GPUs. `build` makes it (`nodes` its nodes, `daemons` what runs on them),
`lifecycle` takes it down and reports on it, `state` is its record, `faults` lists what can be
broken on purpose, `files` holds the text of what it writes, `netns` the system calls.
"""

from trainfleet.sandbox.build import up
from trainfleet.sandbox.faults import FAULTS, Fault
from trainfleet.sandbox.lifecycle import down, status
from trainfleet.sandbox.state import DEFAULT_NAME, Sandbox, load

__all__ = ["DEFAULT_NAME", "FAULTS", "Fault", "Sandbox", "down", "load", "status", "up"]
