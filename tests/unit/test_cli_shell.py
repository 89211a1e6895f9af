"""``coldbrew --version`` and ``coldbrew completion SHELL``, also as ``python -m coldbrew``."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from coldbrew.cli import build_parser, main
from coldbrew.cli.shell import SHELLS, completion_script

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    "command", [[str(BIN / "coldbrew")], [sys.executable, "-m", "coldbrew"]], ids=["script", "-m"]
)
def test_version_names_coldbrew_and_python(command: list[str]) -> None:
    """``coldbrew X.Y.Z (Python A.B.C)``, the version of the installed distribution."""
    done = run(*command, "--version")
    assert done.returncode == 0, done.stderr
    expected = f"coldbrew {version('coldbrew')} (Python {platform.python_version()})"
    assert done.stdout.strip() == expected


@pytest.mark.parametrize("shell", SHELLS)
def test_every_shell_gets_a_script_naming_the_commands(shell: str) -> None:
    """Sub-commands everywhere; flags too, except in tcsh (shtab's tcsh has sub-commands only)."""
    script = completion_script(build_parser(), shell)
    words = ["worker", "submit", "dlq", "replay", "completion"]
    if shell != "tcsh":
        words.append("--app-dir")
    for word in words:
        assert word in script, (shell, word)


def test_completion_prints_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    assert "#compdef coldbrew" in capsys.readouterr().out


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["completion", "klingon"])
    assert caught.value.code == 2
    assert "invalid choice: 'klingon'" in capsys.readouterr().err


def bash_complete(script_file: Path, words: list[str]) -> list[str]:
    """What bash offers for ``words`` (the last one being typed), from the generated script."""
    script = f"""
        source "{script_file}"
        COMP_WORDS=({" ".join(repr(w) for w in words)})
        COMP_CWORD={len(words) - 1}
        COMP_LINE="{" ".join(words)}"
        COMP_POINT=${{#COMP_LINE}}
        _shtab_coldbrew
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_and_flags(tmp_path: Path) -> None:
    """The bash script works in bash: sub-commands, then the flags of one."""
    script_file = tmp_path / "coldbrew.bash"
    script_file.write_text(completion_script(build_parser(), "bash"))
    assert {"worker", "workers"} <= set(bash_complete(script_file, ["coldbrew", "wor"]))
    assert "--app-dir" in bash_complete(script_file, ["coldbrew", "worker", "--app-"])
    assert "replay" in bash_complete(script_file, ["coldbrew", "dlq", ""])
