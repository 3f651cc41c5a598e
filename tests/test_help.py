"""The command-line help: ``python -m megakernel --help`` lists every command, and every
command's ``--help`` shows each option's default."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import subprocess
import sys

import pytest

from conftest import REPO

MAIN_GUARD = 'if __name__ == "__main__"'


def command_modules() -> set[str]:
    """Every module of the package that runs as ``python -m``: a module with a main guard, or a
    subpackage with a ``__main__.py``."""
    pkg = REPO / "megakernel"
    mods = {f"megakernel.{f.stem}" for f in pkg.glob("*.py") if f.stem != "__main__" and MAIN_GUARD in f.read_text()}
    mods |= {f"megakernel.{d.name}" for d in pkg.iterdir() if (d / "__main__.py").exists()}
    return mods


def test_main_help_lists_every_command():
    from megakernel.__main__ import COMMANDS
    assert {mod for mod, _ in COMMANDS.values()} == command_modules()
    r = subprocess.run([sys.executable, "-m", "megakernel", "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.split("commands:")[1].split("\n\n")[0].splitlines() if line.strip()}
    assert listed == set(COMMANDS)


def _help_of(module: str, monkeypatch) -> tuple[argparse.ArgumentParser, str]:
    """The parser ``module``'s main builds, and the help it prints for ``--help``."""
    seen = []
    show = argparse.ArgumentParser.print_help

    def capture(self, file=None):
        seen.append(self)
        show(self, file)
    monkeypatch.setattr(argparse.ArgumentParser, "print_help", capture)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--help"])
    assert exit_.value.code in (0, None)
    assert len(seen) == 1, f"{module} --help printed {len(seen)} parsers' help"
    return seen[0], out.getvalue()


@pytest.mark.parametrize("module", sorted(command_modules()))
def test_every_help_shows_the_defaults(module, monkeypatch):
    parser, printed = _help_of(module, monkeypatch)
    flat = "".join(printed.split())   # argparse wraps lines at spaces and after hyphens
    checked = 0
    for action in parser._actions:
        default = action.default
        if not action.option_strings or default in (None, False, argparse.SUPPRESS) or default == []:
            continue
        text = " ".join(parser._get_formatter()._expand_help(action).split())
        assert "default" in text, f"{module} {action.option_strings[-1]}: no default in its help {text!r}"
        assert "".join(text.split()) in flat, f"{module} {action.option_strings[-1]}: its help is not printed as {text!r}"
        checked += 1
    assert checked, f"{module}: no option with a default to check"
    assert parser.description and parser.description.rstrip().endswith("."), parser.description
