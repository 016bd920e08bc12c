"""A model's measured forward-pass costs, kept across processes in the model's cache folder.

The adaptive draft length (`draft_length.calibrate`) times the target's forward pass at every width
1..max_k+1 before its first step: about 2.5 s for SmolLM2-135M at 17 widths on one CPU thread, more at 33.
Those times depend on the model's weights, the machine, the device, the engine that runs the model (its
version and thread count: `engine_key`) and the batch size, and on nothing a later process changes, so
they are kept as a small JSON file inside a folder of the model cache that belongs to the model's weights
(`model_cache`, keyed by the GGUF's content; the target's `cache_folder`: transformers' converted model,
or for llama.cpp the F16 copy, or the GGUF's cached tokenizer when it runs the file as shipped). Every
clone and venv on the machine then shares them, and they are removed with the entry when it goes stale.
A model without a cache folder (a transformers folder of the user's, a GGUF given by path to
`LlamaCppModel`, or one loaded with use_cache=False) is calibrated once per process.

Writes are atomic (a temporary file renamed into place); a file that cannot be read back as the expected
number of positive seconds is ignored and measured again; a folder that cannot be written leaves the
costs measured per process.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import torch

#: The calibration method's version in file names: files measured another way (a single sweep, before
#: `draft_length.calibrate` re-timed disagreeing widths) are not read.
METHOD = "2"


def torch_engine_key(device: torch.device) -> str:
    """What a torch model's forward time depends on besides its weights: torch's version, and its thread
    count (CPU) or the GPU's name (CUDA)."""
    if device.type == "cuda":
        where = re.sub(r"[^A-Za-z0-9.]+", "_", torch.cuda.get_device_name(device))
    else:
        where = f"threads{torch.get_num_threads()}"
    return f"torch{torch.__version__}-{where}"


def cost_file(folder: Path, device: torch.device, batch: int, widths: int, engine_key: str) -> Path:
    """The file holding the costs of widths 1..widths at this batch size, on this device, with this engine
    (`engine_key`: its version and threads, e.g. `torch_engine_key`) and this machine's CPU count."""
    name = f"draft-costs{METHOD}-{device.type}-{engine_key}-cpus{os.cpu_count()}-batch{batch}-widths{widths}"
    return folder / f"{name}.json"


def read_costs(path: Path, widths: int) -> list[float] | None:
    """The costs stored at path: `widths` positive seconds, or None (no file, or not such a list)."""
    try:
        costs = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(costs, list) or len(costs) != widths:
        return None
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < c < float("inf") for c in costs):
        return None
    return [float(c) for c in costs]


def write_costs(path: Path, costs: list[float]) -> bool:
    """Store costs at path atomically; False when the folder cannot be written (nothing is stored)."""
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.")
    except OSError:
        return False
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(costs, file)
        os.chmod(temporary, 0o644)  # mkstemp's 0o600 would hide it from the machine's other users
        os.replace(temporary, path)
        return True
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return False
