"""Losslessness audit: exact laws (exact.py) held against what a verifier commits.

scenarios.py (the matrix and its exact laws) -> runner.py (one batched call per scenario, judged with
stats.py) -> report.py / plots.py; trees.py does the same for tree scenarios (SPEC §8); invariance.py
decodes a toy model plainly and speculatively; verifier.py loads any callable with the
`stochastic_acceptance_sampler` or the `tree_acceptance_sampler` signature; command.py is the
`specverify audit` command. Importing this package is cheap: the heavy modules load when used.
"""

from .command import add_audit_arguments, run_audit_command

__all__ = ["add_audit_arguments", "run_audit_command"]
