"""A model's measured forward-pass costs, kept across processes in the model's cache folder.

The adaptive draft length (`draft_length.calibrate`) times the target's forward pass at every width
1..max_k+1 before its first step: about 2.5 s for SmolLM2-135M at 17 widths on one CPU thread, more at 33.
Those times depend on the model's weights, the machine, the device, torch's thread count and version and
the batch size, and on nothing a later process changes, so they are kept as a small JSON file inside the
folder the model was loaded from when that folder is an entry of the model cache (`model_cache`, keyed by
the GGUF's content; `HFLanguageModel.cache_folder`). Every clone and venv on the machine then shares them,
and they are removed with the entry when it goes stale. A model without a cache folder (a transformers
folder of the user's, or one loaded with use_cache=False) is calibrated once per process.

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


def cost_file(folder: Path, device: torch.device, batch: int, widths: int) -> Path:
    """The file holding the costs of widths 1..widths at this batch size, on this device, with this
    process's torch version and thread count (CPU) or GPU name (CUDA), and this machine's CPU count."""
    if device.type == "cuda":
        where = re.sub(r"[^A-Za-z0-9.]+", "_", torch.cuda.get_device_name(device))
    else:
        where = f"threads{torch.get_num_threads()}"
    name = f"draft-costs-{device.type}-{where}-cpus{os.cpu_count()}-torch{torch.__version__}-batch{batch}-widths{widths}"
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
