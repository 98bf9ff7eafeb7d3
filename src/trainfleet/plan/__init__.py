"""`trainfleet plan` (in progress): memory per GPU and CPU RAM per node for a model and config.

Today: exact parameter counts from a config (`model.py`), ZeRO-1/2/3 model states per rank to
the byte (`zero.py`), and DeepSpeed's own model-state estimators reproduced to compare against
(`deepspeed_estimates.py`). Not yet: gradients, buckets, activations, logits, CPU RAM while
loading, the search, the command.
"""
