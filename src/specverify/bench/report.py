"""What `specverify bench` shows a person: the results as a table for 80 columns (stdout), and what it is
doing while it works (`Progress`, stderr)."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

#: The width the table is laid out for (a terminal's default).
WIDTH = 80
#: The table's number columns: (heading, width, format), "passes" only where it was metered.
COLUMNS = (
    ("min ms", 9, "{:9.3f}"),
    ("median ms", 10, "{:10.3f}"),
    ("x amax", 7, "{:7.1f}"),
    ("x softmax", 9, "{:9.2f}"),
    ("mem x", 6, "{:6.2f}"),
    ("passes", 6, "{:6.2f}"),
)
#: The case name's column: what the number columns leave of WIDTH; a longer name gets a line of its own.
NAME_WIDTH = WIDTH - sum(width + 1 for _, width, _ in COLUMNS)
#: What the columns mean, under the table; the passes' part only where they were metered.
LEGEND = (
    "min/median ms: of the timed calls; x amax, x softmax: the median over one torch.amax read of the logits "
    "and over one torch.softmax; mem x: the peak memory a call adds, over the logits' bytes"
)
PASSES_LEGEND = "; passes: bytes loaded over the logits' bytes"


def _wrapped(text: str) -> str:
    return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _heading_lines(config: dict) -> list[str]:
    """The configuration, before the table: the shape and machine, the backend, and the notes there are."""
    where = config.get("device_name", f"{config['threads']} threads")
    lines = [
        f"B={config['B']} K={config['K']} V={config['V']} {config['dtype']} on {config['device']} ({where}), "
        f"{config['repeats']} repeats, load average {config['load_average']:.2f}",
        f"backend: {config['kernels']} (loaded in {config['kernels_load_s']:.2f} s)",
    ]
    if "flashinfer" in config:
        lines.append(f"FlashInfer: not timed: {config['flashinfer']}")
    if "tree_nodes" in config:
        lines.append(
            f"tree: {config['tree_nodes']} nodes, depth {config['tree_depth']}, mean accepted path "
            f"{config['tree_mean_path_length']:.2f} (argmax mode, logits of {config['tree_nodes'] + 1} rows per request)"
        )
    return lines


def _case_lines(name: str, entry: dict, columns: tuple) -> list[str]:
    """A case's row: its name and numbers, or, for a name too long for its column, the name on a line of its
    own and the numbers on the next."""
    values = (
        entry["min_ms"],
        entry["median_ms"],
        entry["x_read_floor"],
        entry["x_softmax"],
        entry.get("peak_extra_x_logits"),
        entry.get("passes"),
    )
    numbers = "".join(
        f" {'' if value is None else form.format(value):>{width}}" for (_, width, form), value in zip(columns, values)
    )
    if len(name) > NAME_WIDTH:
        return [name, f"{'':<{NAME_WIDTH}}{numbers}"]
    return [f"{name:<{NAME_WIDTH}}{numbers}"]


def print_table(results: dict, out=None) -> None:
    """The results for a person, laid out for 80 columns (to out, default stdout): the configuration, then
    a row per case (a name too long for its column on a line of its own, its numbers on the next), then what
    the columns mean."""
    out = out or sys.stdout
    for line in _heading_lines(results["config"]):
        print(_wrapped(line), file=out)
    metered = any("passes" in entry for entry in results["cases"].values())
    columns = COLUMNS if metered else COLUMNS[:-1]
    print(f"{'case':<{NAME_WIDTH}}" + "".join(f" {heading:>{width}}" for heading, width, _ in columns), file=out)
    for name, entry in results["cases"].items():
        for line in _case_lines(name, entry, columns):
            print(line, file=out)
    print(_wrapped(LEGEND + (PASSES_LEGEND if metered else "")), file=out)


class Progress:
    """What the benchmark is doing, on stderr (stdout keeps the table or the JSON): a line as each step starts,
    and, while a step runs, a line whenever QUIET seconds have passed without one: after a call where calls
    end that often (the sort-based baseline's take seconds each at the default shape), else from a watch
    thread while one long call runs (a loaded machine can stretch one to tens of seconds). Use it as a
    context manager: the watch runs inside the block."""

    #: Seconds without a line after which one is written.
    QUIET = 2.0
    #: How often the watch thread looks.
    LOOK = 0.25

    def __init__(self, out=None):
        self._out = out or sys.stderr
        self._lock = threading.Lock()
        self._last = self._started = time.monotonic()
        self._step, self._done = "", threading.Event()
        self._watch = threading.Thread(target=self._watching, daemon=True)

    def __enter__(self) -> Progress:
        self._watch.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._watch.join()

    def __call__(self, text: str, step: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if step:
                self._step, self._started = text, now
            if step or now - self._last >= self.QUIET:
                self._say(text, now)

    def _say(self, text: str, now: float) -> None:
        print(f"  {text}", file=self._out, flush=True)
        self._last = now

    def _watching(self) -> None:
        while not self._done.wait(self.LOOK):
            with self._lock:
                now = time.monotonic()
                if self._step and now - self._last >= self.QUIET:
                    self._say(f"{self._step}: {now - self._started:.0f} s so far", now)
