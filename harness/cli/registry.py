"""Shared pieces of the ``fidelity`` command's parsers: argument types and the help formatter.

Each subcommand module (the ones :func:`harness.cli.main.build_parser` lists) lists its parser
builders in a ``COMMANDS`` tuple; :func:`harness.cli.main.build_parser` calls them in order. Nothing registers itself at
import time, so there is no import cycle and no duplicate registration.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

SubParsers = Any  # argparse._SubParsersAction (a private type)
Handler = Callable[[argparse.Namespace], int]
#: A parser builder: adds its subcommand(s) to the top-level subparsers object.
Builder = Callable[[SubParsers], None]


def _int_at_least(minimum: int, words: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {words}, got {v}")
        return v

    return parse


#: argparse ``type=``: an integer >= 1.
positive_int = _int_at_least(1, "a positive integer")
#: argparse ``type=``: an integer >= 0.
nonneg_int = _int_at_least(0, "an integer >= 0")


def device_arg(text: str) -> str:
    """argparse ``type=``: ``cpu``, ``cuda`` or ``cuda:N``."""
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
