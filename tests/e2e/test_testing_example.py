"""README's "Testing your jobs" example, run as written: coldbrew.testing as a user sees it.

The blocks marked ``python testing-example=NAME`` are written to an empty
folder and run with pytest in a subprocess (no PYTHONPATH to this repository,
the settings from the environment as a user's CI would set them), so the
example cannot drift from the helpers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import AMQP_URL, DATABASE_URL

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```python testing-example=(\S+)\n(.*?)^```[ \t]*$", re.M | re.S)


def test_readme_testing_example_passes(tmp_path: Path) -> None:
    blocks = BLOCK.findall(README.read_text(encoding="utf-8"))
    assert [name for name, _ in blocks] == ["myapp.py", "test_myapp.py"]
    for name, body in blocks:
        (tmp_path / name).write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLDBREW_", "PYTHON"))}
    env.update(
        COLDBREW_AMQP_URL=AMQP_URL,
        COLDBREW_DATABASE_URL=DATABASE_URL,
        PYTHONPATH=str(tmp_path),  # the user's own folder, as `pytest` from it would see
    )
    done = subprocess.run(  # noqa: S603 - our interpreter, our files
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
