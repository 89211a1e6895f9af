"""``coldbrew completion SHELL``: a completion script made from the command's own parser.

Why generated, not written by hand: a script kept beside the parser drifts
the first time someone adds a flag. shtab walks the argparse parser and emits
a static script (no Python runs at each TAB press, as argcomplete's hook
would need; pure Python, no dependencies of its own).
"""

from __future__ import annotations

import argparse
import sys

from coldbrew.cli.common import EXIT_OK, Handler, Parser, Subparsers
from coldbrew.settings import Settings

SHELLS = ("bash", "zsh", "fish", "tcsh", "powershell")

INSTALL_HINT = """\
install it for your shell:
  bash  coldbrew completion bash > ~/.local/share/bash-completion/completions/coldbrew
  zsh   coldbrew completion zsh > ~/.zfunc/_coldbrew   (with fpath+=(~/.zfunc) before compinit)
  fish  coldbrew completion fish > ~/.config/fish/completions/coldbrew.fish
  tcsh  coldbrew completion tcsh > ~/.coldbrew.tcsh; echo 'source ~/.coldbrew.tcsh' >> ~/.tcshrc"""


def add_commands(sub: Subparsers[Parser]) -> None:
    """``completion SHELL``."""
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish, tcsh, powershell)",
        description="Print a completion script for SHELL on stdout.",
        epilog=INSTALL_HINT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=SHELLS)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of ``SHELLS``)."""
    import shtab

    return str(shtab.complete(parser, shell=shell))


async def cmd_completion(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.cli import build_parser  # the root parser; coldbrew.cli imports this module

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"completion": cmd_completion}
