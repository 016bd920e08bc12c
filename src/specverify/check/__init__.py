"""The device check (`specverify check`): specverify's kernels on a device (default CUDA) against the
float64 oracle, exact laws and a reference device (default the CPU).

targets.py (a device and its backend) -> exactness.py (truncated_probs against the float64 oracle),
statistics.py (chi-square of what the verifier commits against exact laws, with power) and parity.py (the
same calls on the reference, every differing token classified) -> command.py (the arguments, the run, the
report); `python -m specverify.check` runs it without the `specverify` command. Importing this package is
cheap: the sections load when the check runs.
"""

from .command import add_check_arguments, run_check_command

__all__ = ["add_check_arguments", "run_check_command"]
