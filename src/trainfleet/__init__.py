"""trainfleet: multi-node training from one command on one node; every failure explained.

Modules: `cluster` (the spec), `remote` (parallel ssh), `sandbox` (a cluster in network
namespaces), `cli` (one module per subcommand).
"""

__version__ = "0.1.0"
