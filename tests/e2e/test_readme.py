"""README's "Five minutes with coldbrew", run as written, so the tutorial cannot drift.

The tutorial's fenced blocks carry a mark in their info string:
``python file=NAME`` is written to NAME, ``sh tutorial`` lines are run one by
one, ``sh tutorial-background`` (the worker) is started in the background.
Everything runs in an empty temporary folder, as a new user would: the venv's
``bin`` first on PATH (what ``source .venv/bin/activate`` does), no
PYTHONPATH, a namespace of its own. Each command's exit code must be 0, or
the one its trailing ``# exit code N`` comment announces; the key fields of
the status JSON are checked, never a table's layout. Two settings differ from
a user's: metrics on a free port (9464 may be taken on a shared machine) and
one-second heartbeats, so the cancel lands at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coldbrew.client import Client
from tests.helpers import AMQP_URL, DATABASE_URL, make_settings, status_is, wait_until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w+)[ \t]+([^\n]+)\n(.*?)^```[ \t]*$", re.M | re.S)
EXPECTED_EXIT = re.compile(r"#\s*exit code (\d+)")


@dataclass(frozen=True)
class Block:
    lang: str
    mark: str
    body: str


@dataclass(frozen=True)
class Ran:
    command: str
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def tutorial_blocks() -> list[Block]:
    """The marked blocks of README.md, in order."""
    text = README.read_text(encoding="utf-8")
    blocks = [Block(m[1], m[2].strip(), m[3]) for m in FENCE.finditer(text)]
    return [b for b in blocks if b.mark.startswith(("file=", "tutorial"))]


def commands(body: str) -> list[str]:
    """The command lines of a shell block: no blanks or comment lines; ``\\`` joins lines."""
    found: list[str] = []
    pending = ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            found.append(line.strip())
    return found


def run_segment(lines: list[str], cwd: Path, out: Path, env: dict[str, str]) -> list[Ran]:
    """Run ``lines`` in one bash (so shell variables carry over), each one's output apart."""
    start = len(list(out.glob("*.rc")))
    script = []
    for number, line in enumerate(lines, start):
        script.append(f'{{ {line}\n}} >"{out}/{number}.out" 2>"{out}/{number}.err"')
        script.append(f'echo $? >"{out}/{number}.rc"')
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, timeout=90, check=False)
    ran = []
    for number, line in enumerate(lines, start):
        rc_file = out / f"{number}.rc"
        assert rc_file.exists(), f"{line!r} did not finish"
        ran.append(
            Ran(
                line,
                int(rc_file.read_text()),
                (out / f"{number}.out").read_text(),
                (out / f"{number}.err").read_text(),
            )
        )
    return ran


def user_env(namespace: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("COLDBREW_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        COLDBREW_NAMESPACE=namespace,
        COLDBREW_DATABASE_URL=DATABASE_URL,
        COLDBREW_AMQP_URL=AMQP_URL,
        COLDBREW_METRICS_PORT="0",
        COLDBREW_HEARTBEAT_SECONDS="1",
    )
    return env


def wait_for_log(log: Path, worker: subprocess.Popen[bytes], event: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if f'"event": "{event}"' in log.read_text(errors="replace"):
            return
        assert worker.poll() is None, f"the worker exited {worker.returncode}:\n{log.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"no {event} within {limit}s:\n{log.read_text()}")


def sha_chain(text: str, rounds: int) -> str:
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def check_thumbnail(ran: Ran) -> None:
    status = ran.json()
    assert (status["type"], status["status"]) == ("thumbnail", "succeeded")
    assert status["result"] == {"url": "s3://thumbs/v1.jpg"}
    # a succeeded job has progress 1 and no message (README: "A finished job's record")
    assert (status["progress"], status["progress_message"]) == (1.0, None)


def check_fingerprint(ran: Ran) -> None:
    """The process pool really ran myapp.fingerprint: its result is the hash chain."""
    status = ran.json()
    assert (status["status"], status["queue"]) == ("succeeded", "cpu")
    assert status["result"] == sha_chain("hello", 200_000)


def check_flaky(ran: Ran) -> None:
    status = ran.json()
    assert (status["status"], status["attempt"]) == ("dead", 2)
    assert status["error"]["dead_reason"] == "max_attempts"
    assert status["error"]["message"] == "the upstream is down"


def check_status(ran: Ran) -> None:
    status = ran.json()
    assert status["type"] == "nap"
    assert status["status"] in ("queued", "running")


def check_cancel(ran: Ran) -> None:
    status = ran.json()
    assert status["cancel_requested"] is True or status["status"] == "cancelled"


CHECKS: dict[str, Callable[[Ran], None]] = {
    "coldbrew migrate": lambda ran: None,
    "coldbrew submit thumbnail": check_thumbnail,
    "coldbrew submit fingerprint": check_fingerprint,
    "coldbrew submit flaky": check_flaky,
    "job=$(coldbrew submit nap": lambda ran: None,
    'coldbrew status "$job"': check_status,
    'coldbrew cancel "$job"': check_cancel,
    "coldbrew stats": lambda ran: None,
    "coldbrew dlq list": lambda ran: None,
}


def run_tutorial(tmp: Path, namespace: str) -> tuple[list[Ran], int, str]:
    """Every step of the tutorial; the runs, the worker's exit code and its log."""
    folder, out = tmp / "tour", tmp / "out"
    folder.mkdir()
    out.mkdir()
    env = user_env(namespace)
    log = tmp / "worker.log"
    ran: list[Ran] = []
    segment: list[str] = []
    worker: subprocess.Popen[bytes] | None = None
    try:
        for block in tutorial_blocks():
            if block.mark.startswith("file="):
                (folder / block.mark.removeprefix("file=")).write_text(block.body)
            elif block.mark == "tutorial":
                segment += commands(block.body)
            elif block.mark == "tutorial-background":
                ran += run_segment(segment, folder, out, env)
                segment = []
                assert worker is None, "one background command (the worker) is expected"
                (line,) = commands(block.body)
                with log.open("wb") as sink:
                    worker = subprocess.Popen(
                        ["bash", "-c", f"exec {line}"], cwd=folder, env=env, stdout=sink,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
                wait_for_log(log, worker, "worker_ready", 30)
        ran += run_segment(segment, folder, out, env)
        assert worker is not None, "the tutorial starts no worker"
        nap = next(r for r in ran if r.command.startswith('coldbrew status "$job"')).json()["id"]
        wait_cancelled(namespace, nap, log)
        worker.send_signal(signal.SIGINT)  # Ctrl-C
        code = worker.wait(timeout=30)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
    return ran, code, log.read_text(errors="replace")


def wait_cancelled(namespace: str, job_id: str, log: Path) -> None:
    """The cancelled nap really stops (one heartbeat), long before its 60 s.

    Polled in-process: a ``coldbrew status`` per poll would cost a Python start each.
    """

    async def poll() -> None:
        settings = make_settings(namespace)
        async with Client.connect(settings, broker=False) as client:
            await wait_until(lambda: status_is(client, job_id, "cancelled"), timeout=15)

    try:
        asyncio.run(poll())
    except AssertionError as exc:
        raise AssertionError(
            f"job {job_id} was not cancelled within 15s:\n{log.read_text()}"
        ) from exc


async def test_the_readme_tutorial_runs_as_written(tmp_path: Path, namespace: str) -> None:
    """Files written, commands run, exit codes and status JSON as the README says."""
    ran, worker_code, worker_log = await asyncio.to_thread(run_tutorial, tmp_path, namespace)
    for step in ran:
        match = EXPECTED_EXIT.search(step.command)
        expected = int(match[1]) if match else 0
        assert step.rc == expected, (
            f"{step.command!r} exited {step.rc}, the README says {expected}\n"
            f"stdout:\n{step.out}\nstderr:\n{step.err}\nworker:\n{worker_log}"
        )
    checked = set()
    for step in ran:
        prefixes = [prefix for prefix in CHECKS if step.command.startswith(prefix)]
        assert prefixes, f"a tutorial command this test does not know: {step.command!r}"
        CHECKS[prefixes[0]](step)
        checked.add(prefixes[0])
    assert checked == set(CHECKS), f"gone from the README: {sorted(set(CHECKS) - checked)}"
    flaky = next(r for r in ran if r.command.startswith("coldbrew submit flaky")).json()["id"]
    dlq = next(r for r in ran if r.command.startswith("coldbrew dlq list"))
    assert flaky in dlq.out, dlq.out
    assert worker_code == 0, worker_log


def test_the_tutorial_blocks_are_marked() -> None:
    """The marks this test reads are there: myapp.py, a worker, the commands."""
    marks = [block.mark for block in tutorial_blocks()]
    assert marks.count("file=myapp.py") == 1
    assert marks.count("tutorial-background") == 1
    assert marks.count("tutorial") >= 4
