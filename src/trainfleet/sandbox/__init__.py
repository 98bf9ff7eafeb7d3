"""A real multi-node cluster on one Linux machine: network namespaces, each with sshd.

    >>> from trainfleet import sandbox
    >>> box = sandbox.up(nodes=3, faults=["firewall-blocks-ports@1"])  # doctest: +SKIP
    >>> sandbox.down()  # doctest: +SKIP

For trainfleet's own tests, its demo, and for users who want to rehearse a multi-node launch
before paying for GPUs. `lifecycle` builds and removes it, `faults` lists what can be broken on
purpose, `files` holds the text of what it writes, `netns` the system calls.
"""

from trainfleet.sandbox.faults import FAULTS, Fault
from trainfleet.sandbox.lifecycle import DEFAULT_NAME, Sandbox, down, load, status, up

__all__ = ["DEFAULT_NAME", "FAULTS", "Fault", "Sandbox", "down", "load", "status", "up"]
