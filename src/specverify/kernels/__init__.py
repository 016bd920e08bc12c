"""The hot loops, one backend per device, behind one interface (interface.py): `ops_for(t)` and its ops.

Backends: `native` (compiled C kernels, CPU tensors), `triton` (Triton kernels, CUDA tensors; CPU tensors
under Triton's interpreter) and `torch` (reference/: plain torch, which runs everywhere). The device of
an op's first tensor chooses: CPU -> native, CUDA -> triton, anything else -> torch; where the chosen
backend cannot run (no C compiler, triton not installed) it is reported once by a warning and torch runs
instead. `SPECVERIFY_BACKEND=torch|native|triton` forces one for every op (read at each call, so tests
can switch); an unknown value, or a forced backend that cannot run on the tensors, raises.

Callers take `ops_for(t)` (the module of `backend_for(t)`) and call an op by its name: the verifier's
public functions a whole-call op (interface.WholeCallOps: `verify_chain`), the stages of a whole call
(stages/: the shared code of the backends that build a whole call from steps) the per-row ops
(interface.Ops). Their signatures, shapes and meaning are declared there once; how a backend builds a
whole call (one kernel, or stages over its per-row ops) is its own choice. `.name` is for reports (the
bench).

Adding a backend: (1) a package kernels/<name>/ with a function for every op of interface.py (a
whole-call op may be the stages over its per-row ops: stages.chain.verify_chain), and a module-level
`BACKEND = Backend(name, sys.modules[__name__])` (checked on import for every op); (2) a loader
in registry.py returning that BACKEND or None (raising where forced and it cannot run), and its line in LOADERS
(the default device choice in `backend_for` if it is to run unforced); (3) its name in tests/conftest.py's
backend list, so that it passes what every backend must: tests/kernels/test_backends.py and the tests
that take `each_backend`, then the parity and statistics checks of `specverify check` on its device.
"""

from . import native, reference, registry
from .backend import Backend
from .interface import (
    BLOCK,
    FROM_RESIDUAL,
    FROM_TARGET,
    HOLDS_ABOVE_MINUS_INF,
    HOLDS_NAN_OR_INF,
    WITHOUT_DRAFT,
    Ops,
    block_size,
)
from .registry import BACKENDS, ENVIRONMENT, LOADERS, TORCH, backend_for, forced, ops_for

__all__ = [
    "BACKENDS",
    "BLOCK",
    "ENVIRONMENT",
    "FROM_RESIDUAL",
    "FROM_TARGET",
    "HOLDS_ABOVE_MINUS_INF",
    "HOLDS_NAN_OR_INF",
    "LOADERS",
    "TORCH",
    "WITHOUT_DRAFT",
    "Backend",
    "Ops",
    "backend_for",
    "block_size",
    "forced",
    "native",
    "ops_for",
    "reference",
    "registry",
]
