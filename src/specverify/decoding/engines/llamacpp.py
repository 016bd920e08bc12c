"""llama.cpp as a target or draft engine: GGUF models run through llama-cpp-python's low-level API.

`LlamaCppModel` is a `LanguageModel` (see `model`): the loop, the drafters, grammars, thinking regions
and the adaptive draft length see only `extend`/`truncate`, so they run on llama.cpp unchanged.

- One `llama_context` per session holds the B rows as B sequence ids (`n_seq_max = B`, one KV stream per
  sequence, `max_context` cells each). `extend` puts every real token of every row into one `llama_batch`
  (row b's tokens at positions lengths[b]..., sequence b, each flagged for logits) and reads the outputs
  back in batch order (`llama_get_logits`): logits for every position of a multi-token evaluation, as
  the verifier needs them. `truncate` is `llama_memory_seq_rm(mem, b, length, -1)` per shortened row.
- Contexts are slow to create (0.04 s for one row of 4096 cells, ~0.4 s for three), so a closed session's
  context goes back to its model and the next session of the same batch size reuses it (cleared).
- Threads: `threads` is llama.cpp's thread count for both single-token and batch evaluation.
- A row's logits must not depend on the other rows, nor a token's on the width of the step that brings it
  (one token, or K + 1 to verify): batched output equals each request's output alone, and speculative
  output equals plain output, only then. Three settings make it so on the CPU (each measured on the
  shipped Q4_1 model):
  - Flash attention is on. Without it a token's logits depend on the evaluation's width (up to 1.5 apart).
  - A row extended by more than SHARED_ROW_TOKENS (63) tokens (a prompt) is evaluated in `llama_decode`
    calls of its own, the shorter rows together. For 64 or more queries of one sequence in one call,
    llama.cpp's CPU flash attention takes a kernel tiled by 64 queries that sums in another order: a
    103-token prompt evaluated beside shorter prompts (llama.cpp cuts a call of several sequences into
    equal pieces per sequence, so the piece sizes depend on the other rows) was up to 2.8 apart from the
    same prompt alone, which flipped a greedy token (on AVX2 and AVX-512 builds alike). Evaluated in its
    own calls, a long row's pieces depend on its own length only; a step of 63 tokens or fewer per row
    always takes the one-query kernel, whose logits do not depend on the width.
  - llama.cpp's extra weight buffers (the AMX and repacked CPU matmul kernels, `use_extra_bufts`) are off:
    with them llama-cpp-python 0.3.36 segfaults in `ggml_backend_amx_mul_mat` on the first evaluation on
    Sapphire Rapids CPUs (AMX), through the high-level `Llama` as well.
  With these, a step's logits are bit-identical whether it is evaluated alone, at another width or beside
  other rows. What stays apart, with the verifier exact given the logits it is handed in every case:
  - a prompt of 64 tokens or more is scored by the tiled kernel (up to 2.8 apart from feeding it one token
    at a time), the same in plain and speculative decoding, which both evaluate the prompt in one extend.
    Evaluating every prompt in pieces of 63 would make those equal too, at 2.5x the prefill time (1500
    tokens: 44 s against 18 s, one thread);
  - on an F16 copy the batched F16 matmul sums in another order (up to ~0.1 apart; a near-tie can flip);
  - with `threads` > 1, a lone one-token evaluation whose context has passed 256 positions splits its
    attention over the threads (llama.cpp's split-KV kernel, up to 1.5 apart from the same token in a
    wider step), so with more than one thread speculative output can differ from plain output there.
- Log lines of llama.cpp are silenced (it prints hundreds while loading); failures are raised instead.

Tokenization is not done here: a model's token ids come from the transformers tokenizer of the same GGUF
(`loading.load_tokenizer`), the one the transformers engine uses, so both engines see the same ids.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import torch

from ...contract import PAD
from .base import ContextOverflow, check_truncation, real_token_rows

#: A row's context when the caller gives none: the model's training context, at most this many tokens
#: (its KV cells are allocated when a session starts: SmolLM2-135M, 8192 cells, ~190 MB per row).
DEFAULT_CONTEXT = 8192
#: Tokens per `llama_decode` call, all rows together.
MAX_BATCH = 2048
#: The most tokens of a row evaluated in one `llama_decode` beside other rows: one fewer than the 64 queries
#: of one sequence from which llama.cpp's CPU flash attention switches to its tiled kernel (GGML_FA_TILE_Q
#: in ggml-cpu/common.h of llama-cpp-python 0.3.36); a longer extension of a row gets calls of its own.
SHARED_ROW_TOKENS = 63

_backend_ready = False


@llama_cpp.llama_log_callback
def _silent(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log callback: drop every line (errors surface as return codes)."""


def _init_backend() -> None:
    """Silence llama.cpp's log and initialise its backend, once per process."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_silent, None)
        llama_cpp.llama_backend_init()
        _backend_ready = True


def default_context(trained: int) -> int:
    """A row's context when the caller gives none, for a model trained on `trained` positions (its GGUF's
    `<arch>.context_length`): that, at most DEFAULT_CONTEXT."""
    return min(trained, DEFAULT_CONTEXT)


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1 (got {threads!r})")
    return threads


class LlamaCppModel:
    """A GGUF model run by llama.cpp on the CPU. path: the .gguf file; threads: llama.cpp's threads;
    context_length: the most positions one row may hold (`max_context`; default: the model's training
    context, at most DEFAULT_CONTEXT); cache_folder: where measurements of this model may be kept across
    processes (a model-cache folder of its weights, see `cost_cache`), or None."""

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int = 1,
        context_length: int | None = None,
        cache_folder: Path | None = None,
    ):
        self.threads = _check_threads(threads)
        self.cache_folder = cache_folder
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"path must be a GGUF file (got {str(path)!r}, which is not a file)")
        _init_backend()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = False  # see the module docstring: the AMX kernels crash here
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ValueError(f"path must be a GGUF model llama.cpp can load (got {str(path)!r})")
        self.path = path
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        if context_length is None:
            context_length = default_context(int(llama_cpp.llama_model_n_ctx_train(self._model)))
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
            raise ValueError(f"context_length must be an int >= 1 (got {context_length!r})")
        #: The most positions a row's context may hold (prompt plus generated tokens).
        self.max_context = context_length
        self._idle: dict[int, list[ctypes.c_void_p]] = {}
        self._open = 0  # sessions holding a context
        self._closing = False

    @property
    def engine_key(self) -> str:
        """What a forward pass's time depends on besides the weights (`cost_cache`): llama.cpp's version
        and threads."""
        return f"llamacpp{llama_cpp.__version__}-threads{self.threads}"

    def session(self, batch_size: int) -> LlamaCppSession:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got {batch_size!r})")
        idle = self._idle.get(batch_size)
        if self._closing:
            raise ValueError("the model is closed: load it again")
        context = idle.pop() if idle else self._new_context(batch_size)
        self._open += 1
        return LlamaCppSession(self, context, batch_size)

    def _new_context(self, batch_size: int) -> ctypes.c_void_p:
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = batch_size
        params.n_ctx = self.max_context * batch_size
        params.kv_unified = False  # one KV stream per row: n_ctx_seq = max_context
        # on (llama.cpp's "auto" picks it on the CPU too; llama-cpp-python's Llama turns it off): without it
        # a token's logits depend on how many tokens are evaluated with it (up to 1.5 apart on SmolLM2 Q4_1),
        # with it they do not; side by side it costs the same per step here
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.n_batch = MAX_BATCH
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        context = llama_cpp.llama_init_from_model(self._model, params)
        if not context:
            raise RuntimeError(
                f"llama.cpp could not create a context of {batch_size} rows x {self.max_context} positions "
                f"(out of memory? lower context_length)"
            )
        return context

    def _release(self, context: ctypes.c_void_p, batch_size: int) -> None:
        """Take back a closed session's context, cleared, for the next session of this batch size (freed
        instead once the model is closing; the model goes with its last context)."""
        self._open -= 1
        if self._closing:
            llama_cpp.llama_free(context)
            self._free_model()
            return
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), True)
        self._idle.setdefault(batch_size, []).append(context)

    def close(self) -> None:
        """Free the idle contexts and the model; a session still open keeps the model until it closes."""
        self._closing = True
        for contexts in self._idle.values():
            for context in contexts:
                llama_cpp.llama_free(context)
        self._idle = {}
        self._free_model()

    def _free_model(self) -> None:
        if self._open == 0 and self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        if getattr(self, "_model", None) is not None:
            self.close()


class LlamaCppSession:
    """B rows as B sequence ids of one llama.cpp context (see the module docstring).
    `lengths`: int64 [B], the context length of each row."""

    def __init__(self, model: LlamaCppModel, context: ctypes.c_void_p, batch_size: int):
        self._owner = model
        self._context = context
        self._memory = llama_cpp.llama_get_memory(context)
        self._batch = llama_cpp.llama_batch_init(MAX_BATCH, 0, 1)
        # numpy views of the batch's arrays, made once (each as_array costs more than a one-token step's copy)
        self._ids, self._positions, self._flags = (
            np.ctypeslib.as_array(array, shape=(MAX_BATCH,))
            for array in (self._batch.token, self._batch.pos, self._batch.logits)
        )
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(MAX_BATCH,))[:] = 1  # every token in one sequence
        self._batch_size = batch_size
        self.lengths = torch.zeros(batch_size, dtype=torch.int64)

    def extend(self, tokens: torch.Tensor, *, return_logits: bool = True) -> torch.Tensor | None:
        """tokens: int64 [B, T], -1 right padding -> logits float32 [B, T, V] (zero at padding) or None.

        The batch is checked and laid out in Python lists: a one-token step runs a few torch ops instead
        of a dozen (each costs tens of µs on the caches a llama.cpp forward has just evicted).
        """
        tokens = tokens.to("cpu")
        rows = real_token_rows(tokens, self._batch_size)
        vocab = self._owner.vocab_size
        largest = max((max(row) for row in rows if row), default=-1)
        if largest >= vocab:
            raise ValueError(f"tokens must be ids < {vocab} (got {largest})")
        before = self.lengths.tolist()
        after = [n + len(row) for n, row in zip(before, rows)]
        for row, length in enumerate(after):
            if length > self._owner.max_context:  # llama.cpp would abort the process
                raise ContextOverflow(
                    f"tokens would make row {row} hold {length} positions, past the model's context of "
                    f"{self._owner.max_context} (context_length)"
                )
        flat = torch.empty(sum(map(len, rows)) if return_logits else 0, vocab, dtype=torch.float32)
        for ids, positions, sequences, slots in _decodes(rows, before):
            logits = self._decode(ids, positions, sequences, return_logits)
            if logits is None:
                continue
            if slots[-1] - slots[0] == len(slots) - 1:  # consecutive rows of flat (every one-token step)
                flat[slots[0] : slots[-1] + 1].numpy()[:] = logits
            else:
                flat[slots] = torch.from_numpy(logits)
        self.lengths = torch.tensor(after, dtype=torch.int64)
        if not return_logits:
            return None
        if len(flat) == tokens.numel():
            return flat.view(*tokens.shape, vocab)
        logits = torch.zeros(*tokens.shape, vocab, dtype=torch.float32)
        logits[tokens != PAD] = flat
        return logits

    def _decode(
        self, ids: list[int], positions: list[int], sequences: list[int], return_logits: bool
    ) -> np.ndarray | None:
        """One llama_decode of n <= MAX_BATCH tokens -> a view of their logits float32 [n, V] (valid until
        the next decode), or None when they are not asked for (then not computed)."""
        n = len(ids)
        self._batch.n_tokens = n
        self._ids[:n] = ids
        self._positions[:n] = positions
        self._flags[:n] = return_logits
        for i, sequence in enumerate(sequences):
            self._batch.seq_id[i][0] = sequence
        status = llama_cpp.llama_decode(self._context, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} (1: no KV slot, the context is full)")
        if not return_logits:
            return None
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._context), shape=(n, self._owner.vocab_size))

    def truncate(self, lengths: torch.Tensor) -> None:
        lengths = check_truncation(torch.as_tensor(lengths).to("cpu"), self.lengths)
        for row in (lengths < self.lengths).nonzero()[:, 0].tolist():
            if not llama_cpp.llama_memory_seq_rm(self._memory, row, int(lengths[row]), -1):
                raise RuntimeError(f"llama.cpp could not truncate row {row} to {int(lengths[row])} tokens")
        self.lengths = lengths

    def close(self) -> None:
        """Give the context back to the model (it is reused by the next session of this batch size)."""
        if self._context is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._owner._release(self._context, self._batch_size)
            self._context = None

    def __del__(self) -> None:
        if getattr(self, "_context", None) is not None:
            self.close()


def _decodes(rows: list[list[int]], before: list[int]) -> list[tuple[list[int], list[int], list[int], list[int]]]:
    """The `llama_decode` calls that evaluate rows (row b's tokens at positions before[b]...): per call the
    token ids, positions, sequence ids and each token's index in the row-major concatenation of rows.

    The rows of at most SHARED_ROW_TOKENS tokens go together (one call for every decoding step), then each
    longer row alone (module docstring); either is cut into calls of at most MAX_BATCH tokens.
    """
    starts = [0]
    for row in rows[:-1]:
        starts.append(starts[-1] + len(row))
    shared = [b for b, row in enumerate(rows) if len(row) <= SHARED_ROW_TOKENS]
    alone = [[b] for b, row in enumerate(rows) if len(row) > SHARED_ROW_TOKENS]
    calls = []
    for group in [shared, *alone]:
        ids = [t for b in group for t in rows[b]]
        positions = [before[b] + i for b in group for i in range(len(rows[b]))]
        sequences = [b for b in group for _ in rows[b]]
        slots = [starts[b] + i for b in group for i in range(len(rows[b]))]
        for cut in range(0, len(ids), MAX_BATCH):
            part = slice(cut, cut + MAX_BATCH)
            calls.append((ids[part], positions[part], sequences[part], slots[part]))
    return calls


def convert_to_f16(source: Path, target: Path, *, threads: int = 1) -> None:
    """Write an F16 copy of a GGUF model with llama.cpp's own quantizer (`llama_model_quantize`, F16, the
    source's quantized tensors de-quantized first). Raises RuntimeError when llama.cpp refuses."""
    _init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = _check_threads(threads)
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if status != 0 or not target.is_file():
        raise RuntimeError(f"llama.cpp could not convert {source} to F16 (status {status})")
