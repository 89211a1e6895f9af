"""The dashboard in a real browser: Playwright driving Debian's Chromium (headless) against a
`coldbrew api` subprocess and a real worker.

Signs in, checks that another tenant's jobs stay invisible, cancels a running job and
watches its page turn ``cancelled`` through the event stream, replays a dead job by
reason, pauses the tenant, then (on a second `coldbrew api` without auth: a lane is every
tenant's) pauses and resumes a lane; a screenshot of each step goes to ``$CI_ARTIFACTS/screenshots``
(``tests/artifacts/screenshots`` locally, gitignored). Skipped, with the reason, where
Chromium or the ``playwright`` package is missing, except under CI (``.ci/run`` installs
both), where that is a failure: a green CI must not hide a missing install step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from coldbrew.client import Client
from coldbrew.model import Status
from coldbrew.settings import Settings
from tests.e2e.test_api import tail, wait_listening
from tests.e2e.test_cli import ROOT, cli_env, stop_process
from tests.helpers import WorkerFactory, free_port, wait_until

CHROMIUM = os.environ.get("COLDBREW_CHROMIUM", "/usr/bin/chromium")
ACME_KEY = "browser-acme-key-0123456789"
GLOBEX_KEY = "browser-globex-key-0123456789"
TIMEOUT_MS = 15_000

# exclusive: headless Chromium beside three busy test processes misses its 15 s waits
pytestmark = pytest.mark.exclusive

try:
    from playwright.async_api import Page, async_playwright, expect
except ImportError:  # pragma: no cover - the test extra installs it
    async_playwright = None


def _missing() -> str | None:
    if async_playwright is None:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    return None


def _screenshots() -> Path:
    base = os.environ.get("CI_ARTIFACTS")
    folder = Path(base) / "screenshots" if base else ROOT / "tests" / "artifacts" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def api(settings: Settings, tmp_path: Path) -> AsyncIterator[str]:
    """``coldbrew api`` with one key per tenant; its base URL once /readyz answers."""
    keys = f"{ACME_KEY}:acme,{GLOBEX_KEY}:globex"
    async with _api_process(settings, tmp_path / "api.log", COLDBREW_API_KEYS=keys) as base:
        yield base


@pytest.fixture
async def open_api(settings: Settings, tmp_path: Path) -> AsyncIterator[str]:
    """A second ``coldbrew api`` with auth off: every tenant's access, as a lane needs."""
    log = tmp_path / "open-api.log"
    async with _api_process(settings, log, COLDBREW_API_INSECURE_NO_AUTH="true") as base:
        yield base


@asynccontextmanager
async def _api_process(settings: Settings, log: Path, **env_vars: str) -> AsyncIterator[str]:
    port = free_port()
    env = cli_env(settings, COLDBREW_API_PORT=str(port), **env_vars)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "coldbrew", "api", "--app", "tests.apps:app"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_listening(base, proc, log)
        yield base
    finally:
        stop_process(proc)
        if proc.returncode not in (0, None, -15):
            print(tail(log))


async def test_operator_day_in_a_real_browser(
    api: str, open_api: str, client: Client, start_worker: WorkerFactory
) -> None:
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser test: {missing}")
        pytest.skip(missing)
    await start_worker()
    running = await client.submit("cancellable", tenant="acme")
    dead = await client.submit("always_fails", tenant="acme", max_attempts=1)
    theirs = await client.submit("echo", tenant="globex", queue="parked")
    await client.wait(dead.id, timeout=20)
    await wait_until(lambda: _status_is(client, running.id, Status.RUNNING))
    shots = _screenshots()
    problems: list[str] = []
    assert async_playwright is not None
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = await browser.new_page(base_url=api)
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda m: _note(problems, m.type, m.text))
            await _sign_in(page, shots)
            await _isolation(page, theirs.id, shots)
            await _cancel_and_watch(page, running.id, shots)
            await _replay(page, shots)
            await _pause(page, shots)
            operator = await browser.new_page(base_url=open_api)
            operator.set_default_timeout(TIMEOUT_MS)
            operator.on("console", lambda m: _note(problems, m.type, m.text))
            await _pause_lane(operator, client, shots)
        finally:
            await browser.close()
    assert not problems, problems  # a CSP violation or a script error shows up here
    assert (await client.get(running.id)).status is Status.CANCELLED
    [acme] = [t for t in await client.store.tenants.list_tenants() if t.name == "acme"]
    assert acme.paused
    actions = {e.action for e in await client.store.dashboard.audit_recent("acme")}
    assert actions == {"cancel", "replay", "pause"}
    assert (await client.get(theirs.id)).status is Status.QUEUED  # globex's: untouched
    lane_actions = [(e.action, e.target) for e in await client.store.dashboard.audit_recent(None)]
    assert lane_actions[:2] == [("lane_resume", "lane parked"), ("lane_pause", "lane parked")]


def _note(problems: list[str], kind: str, text: str) -> None:
    """Console errors but the browser's own line for the 404 the isolation step expects."""
    if kind == "error" and "Failed to load resource" not in text:
        problems.append(text)


async def _status_is(client: Client, job_id: str, status: Status) -> bool:
    return (await client.get(job_id)).status is status


async def _sign_in(page: Page, shots: Path) -> None:
    await page.goto("/dashboard")
    assert page.url.endswith("/dashboard/login")
    await page.fill("input[name=key]", "not-a-key-0123456789")
    await page.click("button[type=submit]")
    await expect(page.locator("p.bad")).to_have_text("That API key is not valid.")
    await page.fill("input[name=key]", ACME_KEY)
    await page.click("button[type=submit]")
    await expect(page.locator("header")).to_contain_text("tenant acme")
    cookies = await page.context.cookies()
    assert [c["httpOnly"] for c in cookies] == [True]
    assert ACME_KEY not in str(cookies)  # the cookie holds a session token, not the key
    await page.screenshot(path=str(shots / "1-overview.png"), full_page=True)


async def _isolation(page: Page, other_job: str, shots: Path) -> None:
    """Acme's session sees no globex job or tenant, by list, search or direct link."""
    assert "globex" not in await page.content()
    await page.goto("/dashboard/jobs")
    assert other_job not in await page.content()
    await page.screenshot(path=str(shots / "2-acme-jobs.png"), full_page=True)
    response = await page.goto(f"/dashboard/jobs/{other_job}")
    assert response is not None and response.status == 404
    await page.goto(f"/dashboard/jobs?job_id={other_job}")
    assert "globex" not in await page.content()


async def _cancel_and_watch(page: Page, job_id: str, shots: Path) -> None:
    await page.goto(f"/dashboard/jobs/{job_id}")
    await expect(page.locator("#status")).to_have_text("running")
    await page.click("text=Cancel job")
    await expect(page.locator("#question")).to_contain_text(f"Cancel job {job_id}?")
    await page.screenshot(path=str(shots / "3-confirm-cancel.png"), full_page=True)
    await page.fill("input[name=reason]", "stopped from the browser test")
    await page.click("#confirm")
    await expect(page.locator("#notice")).to_contain_text("Cancel job")
    # the job ends within a heartbeat; the page hears it on its event stream
    await expect(page.locator("#status")).to_have_text("cancelled")
    await expect(page.locator("main")).to_contain_text("stopped from the browser test")
    await page.screenshot(path=str(shots / "4-cancelled.png"), full_page=True)


async def _replay(page: Page, shots: Path) -> None:
    await page.goto("/dashboard/jobs?status=dead")
    await expect(page.locator("table")).to_contain_text("always_fails")
    await page.fill("input[name=reason]", "always")
    await page.click("text=Replay…")
    await expect(page.locator("#question")).to_contain_text("'always'")
    await page.click("#confirm")
    await expect(page.locator("#notice")).to_contain_text("replayed 1 dead job(s)")
    await page.screenshot(path=str(shots / "5-replayed.png"), full_page=True)


async def _pause(page: Page, shots: Path) -> None:
    await page.goto("/dashboard")
    await page.click("a.act:text-is('Pause')")
    await expect(page.locator("#question")).to_have_text("Pause tenant acme?")
    await page.click("#confirm")
    await expect(page.locator("#notice")).to_contain_text("paused")
    row: Any = page.locator("tr", has_text="acme").filter(has_text="paused")
    await expect(row.first).to_be_visible()
    await page.screenshot(path=str(shots / "6-paused.png"), full_page=True)


async def _pause_lane(page: Page, client: Client, shots: Path) -> None:
    """Every tenant's operator pauses lane parked (the workers hold its jobs), then resumes it."""
    await page.goto("/dashboard")
    lane_row: Any = page.locator("h2:text-is('Lane state') + table tr", has_text="parked")
    await lane_row.locator("a.act:text-is('Pause')").click()
    await expect(page.locator("#question")).to_have_text(
        "Pause lane parked on every worker, for every tenant?"
    )
    await page.click("#confirm")
    await expect(page.locator("#notice")).to_contain_text("paused")
    lanes = {lane.name: lane.paused for lane in await client.store.tenants.list_lanes()}
    assert lanes["parked"] is True
    await page.screenshot(path=str(shots / "7-lane-paused.png"), full_page=True)
    await lane_row.locator("a.act:text-is('Resume')").click()
    await page.click("#confirm")
    await expect(page.locator("#notice")).to_contain_text("resumed")
