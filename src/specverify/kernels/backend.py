"""What each backend declares about itself: its name and its ops.

Every backend implements each op of interface.py (WHOLE_CALL_OPS and ROW_OPS); the declaration checks
its module for them, so a backend missing one fails when it is imported, not at its first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from .interface import Ops, WholeCallOps

#: The ops every backend implements: the whole-call ops the verifier's public functions call, and the
#: per-row ops their stages call (interface.py).
WHOLE_CALL_OPS = tuple(name for name in vars(WholeCallOps) if not name.startswith("_"))
ROW_OPS = tuple(name for name in vars(Ops) if not name.startswith("_"))


@dataclass(frozen=True)
class Backend:
    """One backend, as it declares itself.

    name: its value of SPECVERIFY_BACKEND. ops: the module whose functions are its ops (read at each call,
    so a test may replace one).
    """

    name: str
    ops: ModuleType

    def __post_init__(self) -> None:
        missing = [op for op in WHOLE_CALL_OPS + ROW_OPS if not callable(getattr(self.ops, op, None))]
        if missing:
            raise TypeError(
                f"backend {self.name!r} lacks ops of kernels/interface.py in its module {self.ops.__name__}: "
                f"{', '.join(missing)}"
            )
