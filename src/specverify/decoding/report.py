"""What `specverify generate` shows: the answer streamed with accepted draft tokens marked, and a table
comparing speculative with plain decoding."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .chat import ChatTokenizer, TextStream
from .result import GenerationResult, StepEvent, speedup

ACCEPTED_STYLE = "bold green"
RECOVERED_STYLE = "yellow"
LEGEND = Text.assemble(
    ("accepted draft", ACCEPTED_STYLE), " · ", ("recovered (replaced a rejected draft)", RECOVERED_STYLE), " · bonus"
)


class StreamPrinter:
    """Prints row 0's committed text as it comes: accepted draft tokens in green, a token that replaced
    a rejected draft in yellow, bonus tokens plain."""

    def __init__(self, tokenizer: ChatTokenizer, console: Console):
        self._stream = TextStream(tokenizer)
        self._console = console

    def __call__(self, event: StepEvent) -> None:
        if event.row != 0:
            return
        text = Text(self._stream.push(event.tokens[: event.accepted]), style=ACCEPTED_STYLE)
        text.append(self._stream.push(event.tokens[event.accepted :]), style=RECOVERED_STYLE if event.recovered else "")
        self._console.print(text, end="", soft_wrap=True, highlight=False)


def _number(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def results_table(speculative: GenerationResult, plain: GenerationResult | None, identical: bool | None) -> Table:
    """Tokens/s with and without speculation, tokens per target step, acceptance per draft position."""
    table = Table(title="speculative decoding" + (" vs plain decoding" if plain else ""))
    table.add_column("")
    table.add_column("speculative", justify="right")
    if plain is not None:
        table.add_column("plain", justify="right")
    runs = [speculative] + ([plain] if plain is not None else [])
    table.add_row("tokens", *(str(r.num_tokens) for r in runs))
    table.add_row("target steps", *(str(r.steps) for r in runs))
    table.add_row("tokens per step", *(_number(r.tokens_per_step) for r in runs))
    table.add_row("prefill s", *(_number(r.prefill_seconds, 3) for r in runs))
    table.add_row("decode s", *(_number(r.decode_seconds, 3) for r in runs))
    table.add_row("tokens/s", *(_number(r.tokens_per_second, 1) for r in runs))
    if plain is not None:
        table.add_row("speedup", f"{speedup(speculative, plain):.2f}×", "1.00×")
        table.add_row("identical text", "yes" if identical else "NO", "")
    for j, (rate, drafted) in enumerate(zip(speculative.acceptance, speculative.drafted)):
        table.add_row(f"acceptance @ draft {j}", f"{_number(rate)} ({drafted})", *([""] if plain is not None else []))
    return table
