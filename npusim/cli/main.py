"""Entry point: builds the argument parser from the command modules and turns NpusimError into one line, exit 2."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import npusim
import npusim.cli
from npusim.errors import NpusimError


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one sentence (its default), without printing the whole usage block."""

    def error(self, message):
        self.exit(2, f"npusim: error: {message} (see '{self.prog} --help')\n")


class _Version(argparse.Action):
    """--version, reading the installed version only when asked for (see npusim.__version__)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"npusim {npusim.__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="npusim", description="Performance simulator and cost model of Ascend NPUs for "
                                                "sparse-attention LLMs (DeepSeek-V3.2-Exp, V4).")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(npusim.cli.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"npusim.cli.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        args.run(args)
    except NpusimError as exc:
        print(f"npusim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the user named cannot be read or written (a directory, a file in the way, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"npusim: error: {where}cannot read or write it ({exc.strerror or exc})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
