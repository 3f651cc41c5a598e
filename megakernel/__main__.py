"""python -m megakernel: the commands, and ``python -m megakernel COMMAND ...`` to run one."""

from __future__ import annotations

import importlib
import importlib.util
import sys

# command -> (module, what it does); a command whose module is absent from this install is not listed
COMMANDS = {
    "generate": ("megakernel.generate", "continue prompts with a Qwen3 model, streaming the text"),
    "serve": ("megakernel.serve", "an OpenAI-compatible HTTP server"),
    "loadtest": ("megakernel.loadtest", "concurrent streaming clients against a server: requests/s, tokens/s, latency"),
    "bench": ("megakernel.bench", "time the megakernel against its baselines on one prompt"),
    "tune": ("megakernel.tune", "measure tile plans on this GPU and cache the fastest"),
    "tape": ("megakernel.tape", "print a model's instruction tape and its cost estimate, without weights"),
    "compile_check": ("megakernel.compile_check", "compile every kernel for a GPU target, without a GPU"),
}
ALIASES = {"compile-check": "compile_check"}


def available() -> dict[str, tuple[str, str]]:
    return {name: entry for name, entry in COMMANDS.items() if importlib.util.find_spec(entry[0]) is not None}


def usage() -> str:
    commands = available()
    width = max(map(len, commands))
    lines = ["usage: python -m megakernel COMMAND [ARGS ...]   (or python -m megakernel.COMMAND [ARGS ...])", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in commands.items()]
    lines += ["", "python -m megakernel COMMAND --help shows a command's options.", "",
              "first run (no download, a few seconds on a CPU):",
              "  python -m megakernel generate -m tiny-random --random-weights -n 16"]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name = ALIASES.get(argv[0], argv[0])
    commands = available()
    if name not in commands:
        print(f"error: unknown command {argv[0]!r}: choose one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return importlib.import_module(commands[name][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
