"""What every command shares: the global options, the consoles and small parsing helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Callable, Optional, Sequence

import typer
from rich.console import Console

from tuner.errors import TunerError
from tuner.problem import parse_window
from tuner.search.hooks import Hooks
from tuner.store import default_db_url
from tuner.store.redact import redact_url

console = Console()
err_console = Console(stderr=True)
OUTPUT_FORMATS = ("table", "json", "csv")
# Bounds of numbers a command line may give (beyond them, a one-line usage error instead of an
# overflow deep in SQLite or NumPy): ids and counts fit a 64-bit column, seeds NumPy's 32 bits.
MAX_ID = 2**63 - 1
MAX_SEED = 2**32 - 1


def at_most(limit: int) -> Callable[[Optional[int]], Optional[int]]:
    """An option's callback refusing values above `limit`. Given as the option's `max`, the bound would
    read `[1<=x<=9223372036854775807]` in its help; checked here, the help says `[x>=1]`."""

    def check(value: Optional[int]) -> Optional[int]:
        if value is not None and value > limit:
            raise typer.BadParameter(f"{value} is too large (at most {limit})")
        return value

    return check


@dataclass
class State:
    """Options shared by every command (set by the top-level callback), and the search's hooks
    (`main(hooks=...)` replaces them for tests)."""

    db_url: Optional[str] = None
    hooks: Hooks = field(default_factory=Hooks)


state = State()


# One rule for every command that reads or writes the store: `--db URL` after the command, or
# `tuner --db URL` before it, or TUNER_DB; the one after the command wins.
DbOption = Annotated[Optional[str], typer.Option(
    "--db", help="Results store URL (also `tuner --db URL <command>` or TUNER_DB).", show_default=False)]


# A problem's sliding window and logit softcap (Problem.window_left/right, Problem.softcap).
WindowOption = Annotated[Optional[str], typer.Option(
    help="Sliding window L or L,R: a query sees the L keys before it and R after (FlashAttention's "
         "window_size; -1: unbounded).", show_default=False)]
SoftcapOption = Annotated[float, typer.Option(help="Logit softcap X: scores become X*tanh(scores/X); 0: off.")]


def window_option(text: Optional[str]) -> tuple[int, int]:
    """--window as (left, right); absent, no window (-1, -1)."""
    return (-1, -1) if text is None else parse_window(text)


def use_db(db: Optional[str]) -> None:
    """A command's own --db overrides the global one."""
    if db is not None:
        state.db_url = db


def store_epilog() -> str:
    """The help line naming the results store (password hidden)."""
    return f"Results store: {redact_url(default_db_url())} (change it with --db or TUNER_DB)."


def refresh_consoles() -> None:
    """A console sizes itself from the environment (COLUMNS) when it is made: re-read it per invocation."""
    for target, stderr in ((console, False), (err_console, True)):
        fresh = Console(stderr=stderr)
        target.size = (fresh.width, fresh.height)


def may_create_store() -> bool:
    """Readers create only the default store (a first `tuner results` shows an empty
    table); a --db/TUNER_DB that names no existing store is a typo to report."""
    return state.db_url is None


def output_format(value: str, allowed: tuple[str, ...]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise TunerError(f"unknown format {value!r}; expected one of {', '.join(allowed)}")
    return value


def say(text: str, *, stderr: bool = False) -> None:
    """One plain line (no rich markup, no highlighting, never wrapped)."""
    (err_console if stderr else console).print(text, markup=False, highlight=False, soft_wrap=True)


def say_wrapped(pieces: Sequence[str], *, indent: int = 2) -> None:
    """Pieces of one long line (each ending in its separator: "a, ", "b; ") on as few lines as the terminal's
    width allows, continuation lines indented. A line breaks only between pieces, so a figure and its unit,
    or a study name a user copies, stay together; a piece wider than the line stays whole on its own line."""
    width, lines, line = console.width, [], ""
    for piece in pieces:
        if line.strip() and len((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = " " * indent
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    for text in lines:
        say(text)
