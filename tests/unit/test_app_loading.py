"""Where ``load_app`` finds ``MODULE:APP``: the current directory or ``--app-dir``, like uvicorn.

And how it fails: a module that is not there says what was searched and
names ``--app-dir``; an error raised *inside* the user's module is reported
as that error, with its file and line, never as "module not found". Each test
writes its own module under a unique name into ``tmp_path`` and leaves
``sys.path`` and ``sys.modules`` as it found them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldbrew.app import App, load_app
from coldbrew.cli import build_parser
from coldbrew.errors import ConfigurationError
from coldbrew.procpool import ProcessPool
from tests.unit.test_procpool import RecordingHost, job_info

APP_SOURCE = """\
from coldbrew import App

app = App()


@app.job()
def double(ctx, n: int) -> int:
    return 2 * n
"""


@pytest.fixture(autouse=True)
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Restore ``sys.path`` and drop the modules a test imported."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("nc_"):
            del sys.modules[name]


def module_name() -> str:
    return f"nc_{uuid.uuid4().hex[:12]}"


def write_module(folder: Path, source: str = APP_SOURCE) -> str:
    name = module_name()
    (folder / f"{name}.py").write_text(source, encoding="utf-8")
    return name


def test_a_module_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``coldbrew worker myapp:app`` in the folder of myapp.py: cwd goes first on sys.path."""
    name = write_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.curdir, str(tmp_path))]
    app = load_app(f"{name}:app")
    assert isinstance(app, App)
    assert "double" in app.jobs
    assert app.app_dir == str(tmp_path)
    assert sys.path[0] == str(tmp_path)


def test_the_directory_is_not_added_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Already on sys.path (``python -m coldbrew`` puts cwd there): left where it is."""
    name = write_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, "")  # how `python -c` spells the current directory
    load_app(f"{name}:app")
    load_app(f"{name}:app")
    assert sys.path.count(str(tmp_path)) == 0
    assert sys.path.count("") == 1


def test_app_dir_chooses_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--app-dir DIR`` imports from DIR whatever the current directory is."""
    (tmp_path / "jobs").mkdir()
    name = write_module(tmp_path / "jobs")
    monkeypatch.chdir(tmp_path)
    app = load_app(f"{name}:app", "jobs")
    assert app.app_dir == str(tmp_path / "jobs")
    assert sys.path[0] == str(tmp_path / "jobs")


def test_a_missing_module_says_what_was_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories, in order, and the hint ``--app-dir``."""
    monkeypatch.chdir(tmp_path)
    name = module_name()
    with pytest.raises(ConfigurationError) as caught:
        load_app(f"{name}:app")
    message = str(caught.value)
    assert f"no module named {name!r}" in message
    assert f"searched {tmp_path} (the current directory)" in message
    assert sys.path[-1] in message  # the rest of sys.path is listed too
    assert f"holds {name}.py" in message
    assert "--app-dir DIR" in message


def test_a_missing_module_under_app_dir_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"\(--app-dir\)"):
        load_app(f"{module_name()}:app", tmp_path)


def test_a_missing_package_is_not_found_too(tmp_path: Path) -> None:
    """``pkg.mod:app`` where ``pkg`` does not exist: the same "searched" message."""
    with pytest.raises(ConfigurationError, match="searched"):
        load_app(f"{module_name()}.tasks:app", tmp_path)


def test_app_dir_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="--app-dir .* is not a directory"):
        load_app("anything:app", tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("source", "line", "kind"),
    [
        ("from coldbrew import App\n\nimport nc_not_installed\n", 3, "ModuleNotFoundError"),
        ("from coldbrew import App, NoSuchName\n", 1, "ImportError"),
        ("app = None\n\ndef broken(:\n", 3, "SyntaxError"),
        ("x = 1\nraise RuntimeError('config missing')\n", 2, "RuntimeError"),
    ],
)
def test_an_error_inside_the_module_is_reported_as_that(
    tmp_path: Path, source: str, line: int, kind: str
) -> None:
    """The user's own ImportError or SyntaxError: its kind, file and line, not "not found"."""
    name = write_module(tmp_path, source)
    with pytest.raises(ConfigurationError) as caught:
        load_app(f"{name}:app", tmp_path)
    message = str(caught.value)
    assert f"at {tmp_path / name}.py, line {line}: {kind}" in message
    assert "searched" not in message
    assert "--app-dir DIR" not in message


def test_an_error_in_a_module_it_imports_points_there(tmp_path: Path) -> None:
    """The deepest user frame is named: the helper module that raised, not the app module."""
    helper = write_module(tmp_path, "import json\n\nraise ValueError('bad helper')\n")
    name = write_module(tmp_path, f"from coldbrew import App\nimport {helper}\n")
    with pytest.raises(ConfigurationError, match=rf"{helper}\.py, line 3: ValueError: bad helper"):
        load_app(f"{name}:app", tmp_path)


@pytest.mark.parametrize(
    "argv",
    [
        ["--app-dir", "DIR", "worker", "m:app"],
        ["worker", "m:app", "--app-dir", "DIR"],
        ["submit", "echo", "--app", "m:app", "--app-dir", "DIR"],
        ["api", "--app", "m:app", "--app-dir", "DIR"],
    ],
)
def test_app_dir_is_a_global_and_a_per_command_flag(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).app_dir == "DIR"


def test_app_dir_defaults_to_none() -> None:
    """None: ``load_app`` then uses the current directory."""
    assert build_parser().parse_args(["worker", "m:app"]).app_dir is None


async def test_pool_children_import_from_the_parents_app_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child finds the job module through ``app_dir`` alone, from any working directory.

    The folder is taken off the parent's sys.path again before the pool
    starts, so the children cannot inherit it from there (spawn copies sys.path).
    """
    (tmp_path / "app").mkdir()
    (tmp_path / "elsewhere").mkdir()
    name = write_module(tmp_path / "app")
    app = load_app(f"{name}:app", tmp_path / "app")
    sys.path.remove(str(tmp_path / "app"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert app.ref is not None
    pool = ProcessPool(1, app.ref, app_dir=app.app_dir)
    await pool.start()
    try:
        info = job_info(job_type="double")
        result = await pool.run("double", {"n": 21}, info, RecordingHost(), timeout=30)
    finally:
        await pool.close(5)
    assert result == 42
