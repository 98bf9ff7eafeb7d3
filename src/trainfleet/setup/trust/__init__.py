"""`trainfleet setup ssh`: this machine and every node trust every node, each itself included.

`step` runs it; `this_machine` is this machine's side (its key, the nodes' host keys in its
known_hosts); `keyjobs` runs the node side (`trainfleet.node.sshkeys`) on every node and reads
its answers; `hostkeys` holds every name a node is reached by and the keys it offers; `askpass`
logs in once with a password to install a key.
"""
