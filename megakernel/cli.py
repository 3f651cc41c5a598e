"""What the command-line tools share: a parser whose mistakes are one line ``error: ...`` with exit
status 2, help that shows every default, and one way to end: ``error: ...`` (status 2) for bad
input found while running, one line ``interrupted`` (status 130) for Ctrl-C, never a traceback
for either."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


class UsageError(Exception):
    """A mistake in the command line or its input: reported as one line, exit status 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option's help ends with its default, where it has one
    worth printing (not None, False or an empty list) and the help does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (action.option_strings and "%(default)" not in text and "default:" not in text
                and not (default is None or default is False or default == [] or default is argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(message)


def at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def number(text: str) -> float:
    """An argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def description(doc: str) -> str:
    """A tool's description for --help: its docstring's first paragraph after "python -m X: "."""
    first = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
    first = first.split(": ", 1)[1] if first.startswith("python -m ") else first
    return first[:1].upper() + first[1:]


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def run(body: Callable[[], int], errors: tuple = (UsageError, ValueError, OSError, RuntimeError, MemoryError),
        on_interrupt: Callable[[], None] | None = None) -> int:
    """``body()``'s exit status; ``errors`` become one line ``error: ...`` and status 2, Ctrl-C
    one line ``interrupted`` and status 130 (``on_interrupt`` runs first, e.g. to end a half-
    printed stdout line)."""
    try:
        return body()
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        print("interrupted", file=sys.stderr)
        return 130
    except errors as e:
        sys.stdout.flush()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
