"""The plugin's ini keys: a project's pytest settings give the ``--fidelity-*`` options' values.

``fidelity_config = "fidelity.toml"`` under ``[tool.pytest.ini_options]`` (or in pytest.ini / tox.ini) works like
``--fidelity-config``; the command line wins. Paths in an ini file are relative to that file's folder. An ini
value goes through the option's own check, and a bad one is a usage error naming the key (docs/commands.md,
"pytest ini keys").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.errors import UsageError


@dataclass(frozen=True)
class IniKey:
    """One ini key: the option it stands for, its value type and the option's default."""

    #: The option's dest, e.g. ``fidelity_report_dir``; the ini key has the same name.
    dest: str
    #: The option's spelling, for messages.
    flag: str
    help: str
    #: The option's own ``type=`` check (None: the text as it is).
    check: Callable[[str], object] | None = None
    #: The value when neither the command line nor the ini file gives one.
    default: object = None
    #: A path relative to the ini file's folder.
    path: bool = False
    #: A true/false switch (pytest's ``bool`` ini type); the command line can only turn it on.
    switch: bool = False


def add_ini(parser: pytest.Parser, keys: tuple[IniKey, ...]) -> None:
    """Declare ``keys`` with pytest (``pytest --help`` lists them under [pytest] ini-options)."""
    for k in keys:
        if k.switch:
            parser.addini(k.dest, f"{k.help} (as {k.flag}; the command line wins)", type="bool", default=False)
        else:
            parser.addini(k.dest, f"{k.help} (as {k.flag}; the command line wins)", type="string", default="")


def ini_text(config: pytest.Config, dest: str) -> str | None:
    """The ini file's text for ``dest`` (surrounding quotes removed), or None when it does not set it."""
    text = str(config.getini(dest)).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text or None


def ini_path(config: pytest.Config, dest: str) -> Path | None:
    """An ini path value, absolute (relative to the ini file's folder), or None when unset."""
    text = ini_text(config, dest)
    if text is None:
        return None
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return (Path(base) / text).resolve()


def apply_ini(config: pytest.Config, keys: tuple[IniKey, ...]) -> None:
    """Fill every option the command line left unset from the ini file, else with its default."""
    for k in keys:
        given = getattr(config.option, k.dest, None)
        if k.switch:
            setattr(config.option, k.dest, bool(given) or bool(config.getini(k.dest)))
            continue
        if given is not None:
            continue
        text = ini_text(config, k.dest)
        if text is None:
            setattr(config.option, k.dest, k.default)
            continue
        if k.path:
            setattr(config.option, k.dest, str(ini_path(config, k.dest)))
            continue
        try:
            value = k.check(text) if k.check is not None else text
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{config.inipath}: ini key {k.dest} = {text!r}: {exc}") from None
        setattr(config.option, k.dest, value)
