"""Losslessness audit: exact laws (exact.py) held against what a verifier commits.

scenarios.py (the chain matrix, its exact laws and how a chain scenario makes its batched call) and
trees.py (the same for tree scenarios, SPEC §8), both on calls.py (the call and its Observation) ->
runner.py (one call per scenario, judged with stats.py) -> report.py / plots.py; invariance.py decodes a
toy model plainly and speculatively; verifier.py loads any callable with the `stochastic_acceptance_sampler`
or the `tree_acceptance_sampler` signature; command.py is the `specverify audit` command. Importing this
package is cheap: the heavy modules load when used.
"""

from .command import add_audit_arguments, run_audit_command

__all__ = ["add_audit_arguments", "run_audit_command"]
