"""The interface of a backend: what each one declares about itself (its name, its ops, what it can do).

Every backend implements each op of ROW_OPS (signatures and shapes: interface.Ops), `verify_rows` too
where it declares `runs_whole_calls`, and the DRAW_OPS where it declares `draws_rows`; the declaration
checks its module for them, so a backend missing one fails when it is imported, not at its first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from .interface import Ops

#: The per-row ops every backend implements (interface.Ops).
ROW_OPS = tuple(name for name in vars(Ops) if not name.startswith("_"))
#: The op of a backend that runs whole verifier calls.
WHOLE_CALL_OP = "verify_rows"
#: The ops of a backend that draws the target rows of a call itself, weights held inside the kernel.
DRAW_OPS = ("draw_rows", "draw_verdicts", "draw_sampled_verdicts", "recover_kept_rows")


@dataclass(frozen=True)
class Backend:
    """One backend, as it declares itself.

    name: its value of SPECVERIFY_BACKEND. ops: the module whose functions are its ops (read at each call,
    so a test may replace one).
    runs_whole_calls: it runs a whole verifier call in one kernel (`verify_rows`: every rule and the
    first rejection in one launch). skips_rows_cheaply: `weigh_rows` skips a row whose source is negative
    at next to no cost, so a walk over every row costs only the rows still walking (where it does not, a
    caller weighs all its rows in one call instead). draws_rows: `draw_rows` weighs and draws the target
    rows of a chain call without writing their weights out (`draw_verdicts`, `draw_sampled_verdicts`: and
    judges argmax-mode or sampled drafts on them in the same call), and `recover_kept_rows` draws the recoveries of sampled mode from what it
    kept (DRAW_OPS).
    """

    name: str
    ops: ModuleType
    runs_whole_calls: bool = False
    skips_rows_cheaply: bool = False
    draws_rows: bool = False

    def __post_init__(self) -> None:
        declared = ROW_OPS + ((WHOLE_CALL_OP,) if self.runs_whole_calls else ()) + (DRAW_OPS if self.draws_rows else ())
        missing = [op for op in declared if not callable(getattr(self.ops, op, None))]
        if missing:
            raise TypeError(
                f"backend {self.name!r} declares ops its module {self.ops.__name__} lacks: {', '.join(missing)}"
            )
