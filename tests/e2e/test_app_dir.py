"""``coldbrew worker MODULE:APP`` finds the user's module as uvicorn would, pool children too.

The README tutorial (test_readme.py) covers the current directory with the
console script; this covers ``--app-dir`` from another folder with
``python -m coldbrew``, a process-pool job whose module imports a sibling
module, and the two ways the import can fail, as the user sees them (exit 2,
one line, no traceback). No PYTHONPATH anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import AMQP_URL, DATABASE_URL

TASKS = """\
from coldbrew import App, Context

from shapes import area  # a sibling module: the pool child must find it too

app = App()


@app.job(queue="cpu")
def measure(ctx: Context, width: int, height: int) -> dict:
    import os

    return {"area": area(width, height), "pid": os.getpid()}
"""

SHAPES = """\
def area(width: int, height: int) -> int:
    return width * height
"""


def env_for(namespace: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("COLDBREW_") and key != "PYTHONPATH"
    }
    env.update(
        COLDBREW_NAMESPACE=namespace,
        COLDBREW_DATABASE_URL=DATABASE_URL,
        COLDBREW_AMQP_URL=AMQP_URL,
        COLDBREW_METRICS_PORT="0",
        COLDBREW_PROCESSES="1",
    )
    return env


def coldbrew(
    cwd: Path, env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coldbrew", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_ready(worker: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if '"event": "worker_ready"' in log.read_text(errors="replace"):
            return
        assert worker.poll() is None, f"worker exited {worker.returncode}:\n{log.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"worker not ready in 30s:\n{log.read_text()}")


def run_pool_job(tmp: Path, namespace: str) -> tuple[dict[str, object], int, str]:
    (tmp / "project" / "jobs").mkdir(parents=True)
    (tmp / "elsewhere").mkdir()
    (tmp / "project" / "jobs" / "tasks.py").write_text(TASKS)
    (tmp / "project" / "jobs" / "shapes.py").write_text(SHAPES)
    cwd, env = tmp / "elsewhere", env_for(namespace)
    migrated = coldbrew(cwd, env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    log = tmp / "worker.log"
    with log.open("wb") as sink:
        command = [sys.executable, "-m", "coldbrew", "--app-dir", "../project/jobs"]
        worker = subprocess.Popen(
            [*command, "worker", "tasks:app"],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(worker, log)
        args = json.dumps({"width": 6, "height": 7})
        submitted = coldbrew(
            cwd, env, "submit", "measure", "--app", "tasks:app", "--app-dir", "../project/jobs",
            "--args", args, "--wait", "--timeout", "45",
        )  # fmt: skip
        assert submitted.returncode == 0, f"{submitted.stderr}\nworker:\n{log.read_text()}"
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return json.loads(submitted.stdout), code, log.read_text(errors="replace")


async def test_app_dir_serves_a_pool_job_from_another_folder(
    tmp_path: Path, namespace: str
) -> None:
    status, code, log = await asyncio.to_thread(run_pool_job, tmp_path, namespace)
    assert (status["status"], status["queue"]) == ("succeeded", "cpu"), log
    result = status["result"]
    assert isinstance(result, dict)
    assert result["area"] == 42
    assert result["pid"] != os.getpid()  # ran in a pool child, which found tasks and shapes
    assert code == 0, log


def test_a_missing_module_exits_2_saying_where_it_looked(tmp_path: Path) -> None:
    done = coldbrew(tmp_path, env_for("cb_unused"), "worker", "myapp:app")
    assert done.returncode == 2
    assert done.stderr.startswith("coldbrew: cannot import 'myapp:app': no module named 'myapp';")
    assert f"searched {tmp_path} (the current directory)" in done.stderr
    assert "--app-dir DIR" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_error_inside_the_module_exits_2_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text("from coldbrew import App\n\napp = App(\n")
    done = coldbrew(tmp_path, env_for("cb_unused"), "submit", "x", "--app", "myapp:app")
    assert done.returncode == 2
    assert f"failed at {tmp_path / 'myapp.py'}, line 3: SyntaxError" in done.stderr
    assert "no module named" not in done.stderr
    assert "Traceback" not in done.stderr


def test_jobs_commands_before_migrate_say_run_migrate(tmp_path: Path) -> None:
    """The newcomer who skipped ``coldbrew migrate``: exit 2 and what to do, no traceback."""
    env = env_for(f"cb_nomigrate_{os.getpid()}")
    for args in (["submit", "x"], ["status", "00000000-0000-0000-0000-000000000000"]):
        done = coldbrew(tmp_path, env, *args)
        assert done.returncode == 2, done.stderr
        assert "is missing" in done.stderr
        assert "run `coldbrew migrate`" in done.stderr
        assert "Traceback" not in done.stderr
