"""The ``fidelity`` command's one vocabulary (docs/commands.md, "One vocabulary"), checked on the whole parser tree.

The rule is data (``CANONICAL``, ``WRONG``, ``BRITISH``, ``DEPRECATED``, ``PROGRESS``): a new command or flag that
breaks it fails here, naming the command and the flag.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.main import build_parser, main
from harness.cli.vocabulary import POSITIONAL, Deprecated

#: dest -> its one option spelling: the configuration file, a report folder read, where the command writes,
#: an SPDX license, no progress.
CANONICAL = {"config": "--config", "reports": "--reports", "out": "--out", "license": "--license", "quiet": "--quiet"}
#: Spellings of those meanings that no visible flag may use (the meaning's spelling after the arrow).
WRONG = {"--report-dir": "--out", "--reports-dir": "--reports", "--output": "--out", "--output-dir": "--out",
         "--out-dir": "--out", "--outdir": "--out", "--dest": "--out", "--config-file": "--config", "--cfg": "--config",
         "--toml": "--config", "--licence": "--license", "--silent": "--quiet", "--no-progress": "--quiet",
         "--report": "--reports"}
#: British spellings no flag may contain (the Hub, SPDX and the model card say license).
BRITISH = ("licence", "colour", "behaviour", "normalis", "summaris", "initialis", "optimis", "serialis", "analys",
           "favour", "catalogue", "artefact")
#: Flags that name a second output beside --out, with the file they write (anything else ending in -out/-dir/-json
#: that takes a path is refused).
EXTRA_OUTPUTS = {"--corpus-out": "the documents copied from a dataset source", "--results-json": "results.json"}
#: Old spelling -> new, per command: kept for one release, hidden from --help, a note on stderr when used.
DEPRECATED = {("ladder", "--report-dir"): "--out", ("suite build", "--licence"): "--license",
              ("kld stats", "--json"): "--out"}
#: Commands that report progress while they run: exactly these take --quiet (and it means: no progress).
PROGRESS = {"capture", "attribute", "allocate", "ladder", "init"}


def _commands(p: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if path and not (subs and all(a.required for a in subs)):
        yield path, p
    for a in subs:
        for name, child in a.choices.items():
            yield from _commands(child, f"{path} {name}".strip())


COMMANDS = dict(_commands(build_parser()))


def _broken(cmd: str, p: argparse.ArgumentParser) -> list[str]:
    found: list[str] = []
    actions = [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    flags = {s for a in actions for s in a.option_strings}
    for a in actions:
        for flag in a.option_strings:
            if isinstance(a, Deprecated):
                want = DEPRECATED.get((cmd, flag))
                if want is None or a.new != want or a.help != argparse.SUPPRESS or want not in flags:
                    found.append(f"{cmd} {flag}: a deprecated alias not listed as {cmd!r} -> an existing flag")
                continue
            if flag in WRONG:
                found.append(f"{cmd} {flag}: spelled {WRONG[flag]} in this project")
            if any(b in flag for b in BRITISH):
                found.append(f"{cmd} {flag}: a British spelling")
            if a.dest in CANONICAL and flag != CANONICAL[a.dest]:
                found.append(f"{cmd} {flag}: means {a.dest}, spelled {CANONICAL[a.dest]}")
            if flag in CANONICAL.values() and CANONICAL.get(a.dest) != flag:
                found.append(f"{cmd} {flag}: stored as {a.dest!r}, which is not what {flag} means")
            if a.type is Path and flag.endswith(("-out", "-dir", "-json")) and flag not in {*EXTRA_OUTPUTS, "--out"}:
                found.append(f"{cmd} {flag}: an output is --out (or a listed second output)")
        if not a.option_strings:  # a positional form is a second spelling of an option, never the only one
            base = a.dest.removesuffix(POSITIONAL)
            if base in CANONICAL and (a.dest == base or CANONICAL[base] not in flags):
                found.append(f"{cmd} {a.metavar or a.dest}: positional {base} without {CANONICAL[base]}")
    if (cmd in PROGRESS) != ("--quiet" in flags):
        found.append(f"{cmd}: reports progress = {cmd in PROGRESS}, has --quiet = {'--quiet' in flags}")
    return found


def test_the_parser_tree_follows_the_vocabulary() -> None:
    assert {"ladder", "aggregate", "plan", "publish", "publish verify", "verify", "suite build", "kld stats"} <= set(COMMANDS)
    broken = [line for cmd, p in COMMANDS.items() for line in _broken(cmd, p)]
    assert broken == []
    for cmd, flag in DEPRECATED:  # every listed alias still exists (removed together with its entry)
        assert any(isinstance(a, Deprecated) and flag in a.option_strings for a in COMMANDS[cmd]._actions), (cmd, flag)


@pytest.mark.parametrize(("flag", "rule"), [("--report-dir", "spelled --out"), ("--licence", "spelled --license"),
                                            ("--colour-out", "British"), ("--output-json", "an output is --out")])
def test_the_walker_fails_on_a_flag_that_breaks_it(flag: str, rule: str) -> None:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument(flag, type=Path)
    assert any(rule in line for line in _broken("x", p))


def test_the_walker_fails_on_a_positional_only_config_and_a_missing_quiet() -> None:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("config", type=Path)
    p.add_argument("--out", type=Path)
    assert any("positional config without --config" in line for line in _broken("x", p))
    assert any("reports progress = True, has --quiet = False" in line for line in _broken("capture", p))
    p.add_argument("--quiet", action="store_true")
    assert any("reports progress = False, has --quiet = True" in line for line in _broken("x", p))


def test_old_spellings_work_with_one_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["ladder", "f.toml", "--report-dir", str(tmp_path / "r")])
    assert args.out == tmp_path / "r"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == "fidelity: note: --report-dir is deprecated and will be removed in the next release: use --out\n"
    args = build_parser().parse_args(["suite", "build", "--corpus", "c", "--tokenizer", "t", "--n-ctx", "8", "--contexts", "2",
                                      "--shards", "1", "--seed", "0", "--out", "o", "--licence", "MIT"])
    assert args.license == "MIT" and "--licence is deprecated" in capsys.readouterr().err
    assert "--report-dir" not in COMMANDS["ladder"].format_help() and "--licence" not in COMMANDS["suite build"].format_help()


def test_positional_and_option_forms_are_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # both forms reach the command the same way: the suite check names the same missing reports folder
    for form in (["aggregate", str(tmp_path / "nope")], ["aggregate", "--reports", str(tmp_path / "nope")]):
        assert main([*form, "--suite", str(tmp_path / "suite"), "--out", str(tmp_path / "o")]) != 0
        assert str(tmp_path / "suite") in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["ladder", "a.toml", "--config", "b.toml"])
    assert e.value.code == 2 and "config given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["plan", "--candidate", "x"])
    assert e.value.code == 2 and "required: REPORTS (or --reports)" in capsys.readouterr().err


def test_publish_verify_and_its_top_level_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = tmp_path / "set"
    s.mkdir()
    (s / "a.txt").write_text("x\n")
    digest = hashlib.sha256(b"y\n").hexdigest()
    (s / "checksums.txt").write_text(f"{digest}  a.txt\n")  # a changed file
    assert main(["publish", "verify", str(s)]) == 1
    via_publish = capsys.readouterr().err
    assert main(["verify", str(s)]) == 1
    assert capsys.readouterr().err == via_publish and "a.txt" in via_publish
    with pytest.raises(SystemExit):
        main(["publish", "--help"])
    assert "verify" in capsys.readouterr().out
