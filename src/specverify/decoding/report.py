"""What `specverify generate` shows: the answer streamed with accepted draft tokens marked, a table
comparing speculative with plain decoding, and the same as one JSON object (`--json`)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .engines.chat import ChatTokenizer, TextStream
from .loop.result import GenerationResult, StepEvent, speedup

if TYPE_CHECKING:
    from .batch import BatchRun
    from .engines.loading import LoadedModel
    from .settings import GenerateSettings

ACCEPTED_STYLE = "bold green"
RECOVERED_STYLE = "yellow"
LEGEND = Text.assemble(
    ("accepted draft", ACCEPTED_STYLE), " · ", ("recovered (replaced a rejected draft)", RECOVERED_STYLE), " · bonus"
)


#: The columns of a spinner's frame and the space after it; the columns kept free at the end of its line.
SPINNER_COLUMNS = 2
SPARE_COLUMNS = 3


class Progress:
    """What runs now, for a person: a rich spinner on a terminal (erased when the step ends), one plain line
    per step when the output is piped, nothing at all without a console (--json)."""

    def __init__(self, console: Console | None):
        self._console = console
        self._status = None
        self._end_text_line: Callable[[], None] | None = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        """However the command ends (an error, Ctrl-C), the spinner stops first: its thread would draw it again
        below the last line printed."""
        self.done()

    def after_text(self, end_line: Callable[[], None]) -> None:
        """Text was printed without ending its line: end_line() ends it before the next step is shown."""
        self._end_text_line = end_line

    def show(self, message: str) -> None:
        """Say that `message` runs now, in place of what was shown before."""
        if self._console is None:
            return
        if self._end_text_line is not None:
            self._end_text_line()
            self._end_text_line = None
        if not self._console.is_terminal:
            self._console.print(f"[dim]{message}[/dim]")
        elif self._status is None:
            self._status = self._console.status(self._one_line(message))
            self._status.start()
        else:
            self._status.update(self._one_line(message))

    def update(self, message: str) -> None:
        """Change the words of the step shown (on a terminal only: a piped log gets a line per step, not per
        update)."""
        if self._status is not None:
            self._status.update(self._one_line(message))

    def _one_line(self, message: str) -> Text:
        """`message` cut (with an ellipsis) to one line beside the spinner, with SPARE_COLUMNS left free: the
        spinner's line is erased by moving the cursor back over the lines it drew, and a "^C" that a terminal
        echoes past the edge would wrap onto a line it does not know of, leaving the spinner on the screen."""
        width = max(self._console.width - SPINNER_COLUMNS - SPARE_COLUMNS, 1)
        text = Text(message)
        text.truncate(width, overflow="ellipsis")
        return text

    def done(self) -> None:
        """The step shown has ended: its spinner goes (the line it held is erased)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    @contextlib.contextmanager
    def step(self, message: str) -> Iterator[None]:
        """Show `message` while the block runs."""
        self.show(message)
        try:
            yield
        finally:
            self.done()


class StreamPrinter:
    """Prints row 0's committed text as it comes: accepted draft tokens in green, a token that replaced
    a rejected draft in yellow, bonus tokens plain. The first text ends the step `progress` shows, and a
    later step's spinner starts on a line of its own (a spinner redraws its line: it would erase the text)."""

    def __init__(self, tokenizer: ChatTokenizer, console: Console, progress: Progress):
        self._stream = TextStream(tokenizer)
        self._console = console
        self._progress = progress
        self._line_open = False

    def __call__(self, event: StepEvent) -> None:
        if event.row != 0:
            return
        self._progress.done()
        text = Text(self._stream.push(event.tokens[: event.accepted]), style=ACCEPTED_STYLE)
        text.append(self._stream.push(event.tokens[event.accepted :]), style=RECOVERED_STYLE if event.recovered else "")
        self._console.print(text, end="", soft_wrap=True, highlight=False)
        if text.plain:
            self._line_open = not text.plain.endswith("\n")
        if self._line_open:
            self._progress.after_text(self.end_line)

    def end_line(self) -> None:
        """End the line the streamed text left open (nothing when it ended with a newline)."""
        if self._line_open:
            self._console.print()
            self._line_open = False


class BatchProgress:
    """The step of a batch being decoded: how many of its requests' tokens are committed so far."""

    def __init__(self, requests: int, progress: Progress):
        self._requests, self._progress, self._tokens, self._started = requests, progress, 0, False

    def __call__(self, event: StepEvent) -> None:
        self._tokens += len(event.tokens)
        requests = f"{self._requests} request" + "s" * (self._requests != 1)
        message = f"decoding {requests}: {self._tokens} tokens committed"
        if not self._started:
            self._progress.done()
            self._progress.show(message)
            self._started = True
        else:
            self._progress.update(message)


def _number(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


#: Draft positions the results table shows one row each (the rest in one row, or all with details=True).
SHOWN_POSITIONS = 4


def results_table(
    speculative: GenerationResult, plain: GenerationResult | None, identical: bool | None, details: bool = False
) -> Table:
    """Tokens/s with and without speculation, tokens per target step, acceptance at the first draft positions
    and over the later ones together (every position with details)."""
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
    blank = [""] if plain is not None else []
    shown = len(speculative.drafted) if details else SHOWN_POSITIONS
    for j, (rate, drafted) in enumerate(zip(speculative.acceptance[:shown], speculative.drafted[:shown])):
        table.add_row(f"acceptance @ draft {j}", f"{_number(rate)} ({drafted})", *blank)
    later_drafted, later_accepted = sum(speculative.drafted[shown:]), sum(speculative.accepted[shown:])
    if later_drafted:
        rate = _number(later_accepted / later_drafted)
        table.add_row(f"acceptance @ drafts {shown}+", f"{rate} ({later_drafted})", *blank)
    return table


def json_report(settings: GenerateSettings, target: LoadedModel, run: BatchRun) -> str:
    """Everything as one JSON object on one line: the settings (the flags as given), a single request's fields
    at the top level, a batch's under "requests"."""
    spec, plain = run.speculative, run.plain
    each = [
        {
            "prompt": r.prompt,
            "prompt_tokens": len(ids),
            "seed": r.seed,
            "text": text,
            "grammar": check,
            "tokens": tokens,
            "identical": None if run.identical is None else run.identical[b],
        }
        for b, (r, ids, text, check, tokens) in enumerate(
            zip(run.requests, run.prompt_ids, run.texts, run.checks, spec.tokens)
        )
    ]
    report = {
        "model": target.source,
        "load_seconds": round(target.seconds, 3),
        "settings": settings.flags,
        **(each[0] if settings.single else {"requests": each}),
        "speculative": spec.summary(),
        "plain": plain.summary() if plain is not None else None,
        "identical": None if plain is None else all(run.identical),
        "speedup": round(speedup(spec, plain), 4) if plain is not None else None,
    }
    return json.dumps(report)


def print_results(console: Console, run: BatchRun, relaxed: bool, single: bool, details: bool = False) -> None:
    """The live view's end: each request's text for a batch, the results table, why texts differ, the grammar's verdict."""
    spec, plain = run.speculative, run.plain
    identical = None if plain is None else all(run.identical)
    if not single:
        for b, (request, text) in enumerate(zip(run.requests, run.texts)):
            console.print(
                f"[bold]request {b + 1}[/bold] [dim]({request.origin} · seed {request.seed} · "
                f"{len(spec.tokens[b])} tokens)[/dim]"
            )
            console.print(text, highlight=False, soft_wrap=True)
            print_grammar_check(console, run.checks[b])
    console.print()
    console.print(results_table(spec, plain, identical, details))
    if identical is False and relaxed:
        console.print("[yellow]the texts differ: expected with --relaxed (lossy inside thinking regions)[/yellow]")
    elif identical is False:
        console.print(
            "[yellow]the texts differ: expected with --draft-proposal sampled (same distribution, other draws); "
            "in argmax mode it means the target's logits differed between the runs at a near-tie[/yellow]"
        )
    if single:
        print_grammar_check(console, run.checks[0])


def print_grammar_check(console: Console, check: dict | None) -> None:
    """Whether an answer satisfies its request's grammar (nothing for a request without one)."""
    if check is not None and not check["complete"]:
        console.print("[yellow]the answer is incomplete: --max-tokens ended it before the grammar did[/yellow]")
    elif check is not None and check.get("schema_error"):
        console.print(f"[red]the answer does not satisfy the schema: {check['schema_error']}[/red]")
    elif check is not None:
        checked = " (checked with jsonschema)" if "schema_error" in check else ""
        console.print(f"[green]the answer satisfies the grammar{checked}[/green]")
