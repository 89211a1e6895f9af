"""scripts/ensure-services deciding whether to install PostgreSQL and RabbitMQ.

The machine's services cannot be uninstalled to try this, and apt-get must
never run in a test. So: the decision functions of scripts/lib/install.sh
are called directly, and the whole script runs with
COLDBREW_ENSURE_ASSUME_MISSING (it sees the packages as not installed), URLs
on ports where nothing listens, and COLDBREW_ENSURE_DRY_RUN=1 (it prints the
apt-get line instead of running it). "No root" is real: the script runs as
the user nobody (setpriv) when the tests run as root.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure-services"
LIB = ROOT / "scripts" / "lib" / "install.sh"
BOTH = "apt-get update && apt-get install -y postgresql rabbitmq-server"


def decide(env: dict[str, str], on_tty: bool = False, can: bool = True) -> tuple[int, str, str]:
    """``install_choice "$(install_wish)" ON_TTY CAN`` under ``env``: (status, choice, stderr)."""
    flags = f"{str(on_tty).lower()} {str(can).lower()}"
    script = f'source "{LIB}"; wish=$(install_wish) || exit $?; install_choice "$wish" {flags}'
    clean = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CI", "COLDBREW_INSTALL_SERVICES")
    }
    done = subprocess.run(
        ["bash", "-c", script],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("env", "on_tty", "can", "choice"),
    [
        ({}, False, True, "advise"),  # no terminal, not asked to: only print the line
        ({}, True, True, "ask"),  # a person at a terminal is asked first
        ({}, True, False, "advise"),  # cannot become root: asking would be pointless
        ({"COLDBREW_INSTALL_SERVICES": "yes"}, False, True, "install"),
        ({"COLDBREW_INSTALL_SERVICES": "YES"}, True, True, "install"),
        ({"COLDBREW_INSTALL_SERVICES": "yes"}, False, False, "advise"),
        ({"COLDBREW_INSTALL_SERVICES": "no"}, True, True, "advise"),
        ({"COLDBREW_INSTALL_SERVICES": "ask"}, False, True, "advise"),
        ({"COLDBREW_INSTALL_SERVICES": "ask"}, True, True, "ask"),
        ({"CI": "true"}, False, True, "install"),  # CI counts as yes
        (
            {"CI": "true", "COLDBREW_INSTALL_SERVICES": "no"},
            False,
            True,
            "advise",
        ),  # unless told no
        ({"CI": "false"}, False, True, "advise"),
    ],
)
def test_the_install_decision(env: dict[str, str], on_tty: bool, can: bool, choice: str) -> None:
    assert decide(env, on_tty, can) == (0, choice, "")


def test_a_bad_install_setting_names_the_variable() -> None:
    status, choice, stderr = decide({"COLDBREW_INSTALL_SERVICES": "maybe"})
    assert (status, choice) == (2, "")
    assert "COLDBREW_INSTALL_SERVICES must be yes, no or ask; got maybe" in stderr


def free_ports(count: int) -> list[int]:
    """Ports where nothing listens (bound, read, released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def script_env(**extra: str) -> dict[str, str]:
    """A machine without PostgreSQL and RabbitMQ, whose URLs point where nothing listens."""
    pg_port, mq_port = free_ports(2)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CI", "COLDBREW_INSTALL_SERVICES") and not key.startswith("COLDBREW_")
    }
    env.update(
        COLDBREW_DATABASE_URL=f"postgresql://127.0.0.1:{pg_port}/coldbrew",
        COLDBREW_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{mq_port}/",
        COLDBREW_ENSURE_ASSUME_MISSING="postgresql rabbitmq-server",
        COLDBREW_ENSURE_DRY_RUN="1",
    )
    env.update(extra)
    return env


def ensure(env: dict[str, str], *, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)]
    if as_nobody and os.getuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to run the script without root"
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(
        command,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_root_it_prints_the_exact_sudo_line() -> None:
    """No root, no sudo: nothing is installed, and the line to run is printed whole."""
    done = ensure(script_env(), as_nobody=True)
    assert done.returncode == 3
    assert (
        "sudo apt-get update && sudo apt-get install -y postgresql rabbitmq-server" in done.stderr
    )
    assert "installing" not in done.stdout
    assert "would run" not in done.stdout
    assert "COLDBREW_INSTALL_SERVICES=yes" not in done.stderr  # it could not anyway


def test_as_root_without_a_terminal_it_only_advises() -> None:
    """Not asked to install and no one to ask: the line, and how to let the script do it."""
    done = ensure(script_env())
    assert done.returncode == 3
    assert "installing" not in done.stdout
    if os.getuid() == 0:
        assert f"  {BOTH}\n" in done.stderr
        assert f"COLDBREW_INSTALL_SERVICES=yes {SCRIPT}" in done.stderr


def test_install_services_no_never_installs() -> None:
    done = ensure(script_env(COLDBREW_INSTALL_SERVICES="no", CI="true"))
    assert done.returncode == 3
    assert "installing" not in done.stdout
    assert "COLDBREW_INSTALL_SERVICES=yes" not in done.stderr


@pytest.mark.parametrize("extra", [{"COLDBREW_INSTALL_SERVICES": "yes"}, {"CI": "true"}])
def test_yes_or_ci_installs_both_in_one_apt_get(extra: dict[str, str]) -> None:
    """The dry run shows the apt-get it would run; the services stay missing (exit 3)."""
    if os.getuid() != 0:
        pytest.skip("installing needs root; this run is not root")  # pragma: no cover
    done = ensure(script_env(**extra))
    assert done.returncode == 3
    assert "installing postgresql rabbitmq-server with apt-get..." in done.stdout
    assert f"would run: {BOTH}" in done.stdout
    assert "nothing was installed" in done.stderr


def test_nothing_is_installed_where_a_service_answers() -> None:
    """Not installed here, but something listens on the URL's port: that server is used."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        closer = threading.Thread(target=hang_up, args=(listener,), daemon=True)
        closer.start()
        env = script_env(
            COLDBREW_INSTALL_SERVICES="yes",
            COLDBREW_DATABASE_URL=f"postgresql://127.0.0.1:{port}/x",
        )
        done = ensure(env)
    assert "would run: apt-get update && apt-get install -y rabbitmq-server\n" in done.stdout


def hang_up(listener: socket.socket) -> None:
    """Accept and close at once, so probes learn fast that this is not PostgreSQL."""
    with contextlib.suppress(OSError):  # the listener closes at the end of the test
        while True:
            conn, _ = listener.accept()
            conn.close()


def test_a_bad_install_setting_stops_the_script() -> None:
    done = ensure(script_env(COLDBREW_INSTALL_SERVICES="sure"))
    assert done.returncode == 2
    assert "ensure-services: COLDBREW_INSTALL_SERVICES must be yes, no or ask" in done.stderr


def on_a_terminal(env: dict[str, str], answer: bytes) -> tuple[int, str]:
    """Run the script on a pseudo-terminal, answer its question; (status, all it showed)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(ROOT)
        os.execve(str(SCRIPT), [str(SCRIPT)], env)
    shown = b""
    deadline = time.monotonic() + 30
    answered = False
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
        if not answered and b"[y/N]" in shown:
            os.write(fd, answer)
            answered = True
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


@pytest.mark.parametrize(("answer", "installs"), [(b"y\n", True), (b"\n", False)])
def test_on_a_terminal_it_asks_first(answer: bytes, installs: bool) -> None:
    if os.getuid() != 0:
        pytest.skip(
            "the question is only asked when installing is possible (root)"
        )  # pragma: no cover
    status, shown = on_a_terminal(script_env(), answer)
    assert "install postgresql and rabbitmq-server with apt-get? [y/N]" in shown
    assert status == 3
    assert (f"would run: {BOTH}" in shown) is installs
    assert ("To install them, run:" in shown) is not installs
