"""The CLI as people meet it: empty states, errors on stderr and data on stdout, progress of
`submit --wait` off a terminal, `stats --since` counting finished jobs.

Most commands run in this process (``coldbrew.cli.main`` in a thread, stdout and stderr
captured): the same parser, handlers and exit codes as the subprocess, without paying an
interpreter's start-up for each of some thirty commands. `submit --wait` runs as a
subprocess, as a user runs it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import pytest

from coldbrew.cli import main
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, one_line, run_cli
from tests.helpers import WorkerFactory, status_is, wait_until, worker_env


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


_CLI_LOCK = threading.Lock()


async def cli(settings: Settings, *argv: str) -> Ran:
    """``coldbrew ARGV`` in this process with ``settings``' environment (one at a time:
    the environment and sys.stdout/stderr are the process's)."""
    env = {k: v for k, v in worker_env(settings).items() if k.startswith("COLDBREW_")}

    def call() -> Ran:
        with _CLI_LOCK:
            return _call()

    def _call() -> Ran:
        saved = {k: v for k, v in os.environ.items() if k.startswith("COLDBREW_")}
        for key in saved:
            del os.environ[key]
        os.environ.update(env)
        out, err = io.StringIO(), io.StringIO()
        try:
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    code = main(list(argv))
                except SystemExit as exc:  # argparse's usage errors
                    code = int(exc.code or 0)
        finally:
            for key in env:
                os.environ.pop(key, None)
            os.environ.update(saved)
        return Ran(code, out.getvalue(), err.getvalue())

    return await asyncio.to_thread(call)


async def cli_all(settings: Settings, commands: list[tuple[str, ...]]) -> list[Ran]:
    return [await cli(settings, *command) for command in commands]


EMPTY_STATES = {
    ("stats", "--sample", "0"): "no jobs waiting or running, and none finished in the last 1h",
    ("workers",): "no live workers",
    ("dlq", "list"): "no dead jobs",
    ("dlq", "list", "--rejected"): "no rejected messages",
    ("dlq", "replay", "--reason-contains", "timeout"): "no dead jobs whose reason contains",
    ("tenants", "list"): "no tenants yet",
    ("types", "list"): "no job types",
}


async def test_every_list_has_an_empty_state(settings: Settings) -> None:
    """On a fresh namespace, each listing command exits 0 and prints one line in parentheses
    on stdout saying what is empty, and nothing on stderr."""
    commands = list(EMPTY_STATES)
    done = await cli_all(settings, commands)
    for command, result in zip(commands, done, strict=True):
        assert result.returncode == 0, (command, result.stderr)
        assert result.stderr == "", (command, result.stderr)
        lines = result.stdout.splitlines()
        assert len(lines) == 1, (command, result.stdout)
        assert lines[0].startswith("(") and lines[0].endswith(")"), (command, lines)
        assert EMPTY_STATES[command] in lines[0], (command, lines)


async def test_json_listings_are_empty_lists(settings: Settings) -> None:
    """With --json an empty listing is `[]`, never a sentence."""
    commands = [
        ("stats", "--json", "--sample", "0"),
        ("workers", "--json"),
        ("dlq", "list", "--json"),
        ("dlq", "list", "--rejected", "--json"),
        ("tenants", "list", "--json"),
        ("types", "list", "--json"),
    ]
    done = await cli_all(settings, commands)
    for command, result in zip(commands, done, strict=True):
        assert result.returncode == 0, (command, result.stderr)
        assert json.loads(result.stdout) == [], (command, result.stdout)


ERRORS = {
    ("stats", "--since", "soon"): (2, "--since must be a duration like 90s, 15m, 1h or 7d"),
    ("stats", "--since", "0s"): (2, "--since must be more than 0 s"),
    ("stats", "--since=-5m"): (2, "--since must be a duration"),
    ("submit", "echo", "--wait", "--timeout", "0"): (2, "--timeout must be in"),
    ("dlq", "list", "--limit", "0"): (2, "--limit must be in 1..10000"),
    ("dlq", "replay", "--job-id", "nope"): (1, "job nope is not dead; nothing to replay"),
    ("cancel", "nope"): (1, "no job"),
    ("status", "nope"): (1, "no job"),
}


async def test_errors_are_one_stderr_line_and_no_stdout(settings: Settings) -> None:
    """A refused flag or a failed operation: exit 2 (usage) or 1 (operation), one line on
    stderr naming the problem, nothing on stdout."""
    commands = list(ERRORS)
    done = await cli_all(settings, commands)
    for command, result in zip(commands, done, strict=True):
        code, needle = ERRORS[command]
        assert result.returncode == code, (command, result)
        assert needle in one_line(result.stderr), (command, result.stderr)
        assert result.stdout == "", (command, result.stdout)


async def test_submit_of_an_unregistered_type_says_which_lane(settings: Settings) -> None:
    """Without --app, a type no worker registered goes to lane default, and stderr says so;
    stdout keeps the status JSON alone."""
    done = await cli(settings, "submit", "mystery", "--args", "{}")
    assert done.returncode == 0, done.stderr
    assert one_line(done.stderr) == (
        "coldbrew: type 'mystery' is not registered by any worker yet; submitted on lane 'default'"
    )
    assert json.loads(done.stdout)["queue"] == "default"


async def test_submit_wait_times_out_with_one_line(settings: Settings) -> None:
    """`submit --wait --timeout` on a job nobody serves: exit 1, its current status JSON on
    stdout, one stderr line that names the job and says it goes on."""
    done = await cli(
        settings,
        "submit",
        "echo",
        "--queue",
        "nowhere",
        "--wait",
        "--timeout",
        "0.5",
        "--json",
    )
    assert done.returncode == 1, done.stderr
    status = json.loads(done.stdout)
    assert status["status"] == "queued"
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"coldbrew: job {status['id']} is still queued after 0.5 s")
    assert f"coldbrew status {status['id']}" in lines[-1]
    assert "Traceback" not in done.stderr


async def test_submit_wait_off_a_terminal_prints_progress_lines(
    settings: Settings, start_worker: WorkerFactory
) -> None:
    """Not on a terminal, `submit --wait` writes one line per change on stderr, each starting
    with the job id (steps and the final status among them), and only the final status JSON
    on stdout; --json gives the same stdout."""
    await start_worker()
    env = cli_env(settings)
    args = ("submit", "progress_steps", "--args", '{"steps": 3, "pause": 0.4}', "--wait")
    plain, as_json = await asyncio.gather(run_cli(env, *args), run_cli(env, *args, "--json"))
    for done in (plain, as_json):
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)  # stdout is the JSON and nothing else
        assert status["status"] == "succeeded"
        lines = done.stderr.strip().splitlines()
        assert lines, done.stderr
        prefix = status["id"] + "  progress_steps default@default"
        assert all(line.startswith(prefix) for line in lines), lines
        assert len(lines) == len(set(lines)), lines  # one line per change, none twice
        assert any("step 2" in line for line in lines), lines
        assert "succeeded 100%" in lines[-1], lines


async def test_stats_since_counts_finished_jobs(
    settings: Settings, start_worker: WorkerFactory, client: Client
) -> None:
    """`stats --since` counts succeeded, failed and cancelled jobs of the window per lane and
    tenant (a lane whose jobs all succeeded is a row too); a window that ends before they
    finished counts none of them."""
    await start_worker()
    ok = [await client.submit("echo", {"value": n}, tenant="acme") for n in range(2)]
    bad = await client.submit("permanent", {}, tenant="acme")
    cancelled = await client.submit("echo", {}, tenant="globex", queue="nowhere")
    await client.cancel(cancelled.id)
    for job in [*ok, bad]:
        await client.wait(job.id, timeout=20)
    await wait_until(lambda: status_is(client, cancelled.id, "cancelled"))
    finished_by = time.monotonic()
    table, as_json = await cli_all(
        settings,
        [
            ("stats", "--since", "15m", "--sample", "0"),
            ("stats", "--since", "15m", "--sample", "0", "--json"),
        ],
    )
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    rows = {(r["queue"], r["tenant"]): r["window"] for r in json.loads(as_json.stdout)}
    assert rows[("default", "acme")] | {
        "run_p50_seconds": 0,
        "run_p95_seconds": 0,
        "wait_p50_seconds": 0,
    } == {
        "seconds": 900.0,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 0,
        "dead": 0,
        "run_p50_seconds": 0,
        "run_p95_seconds": 0,
        "wait_p50_seconds": 0,
        "percentile_relative_error": pytest.approx(0.0443, abs=1e-4),
    }
    assert rows[("default", "acme")]["run_p50_seconds"] is not None
    nowhere = rows[("nowhere", "globex")]
    assert (nowhere["cancelled"], nowhere["succeeded"]) == (1, 0)
    acme = [line.split() for line in table.stdout.splitlines() if line.startswith("default ")]
    assert acme and acme[0][:2] == ["default", "acme"], table.stdout
    assert acme[0][acme[0].index("│") + 1 : acme[0].index("│") + 5] == ["2", "1", "0", "0"]
    await asyncio.sleep(max(0.0, finished_by + 1.2 - time.monotonic()))
    later = await cli(settings, "stats", "--since", "1s", "--sample", "0", "--json")
    assert later.returncode == 0, later.stderr
    windows = [row["window"] for row in json.loads(later.stdout)]
    assert all(w["succeeded"] == w["failed"] == w["cancelled"] == 0 for w in windows), windows
