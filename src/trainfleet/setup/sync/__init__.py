"""`trainfleet sync [DIR]`: the same code at the same path on every node that does not share
this machine's copy.

`step` decides which nodes need it and reports; `transfer` copies (rsync over ssh, or tar over
ssh and a prune).
"""
