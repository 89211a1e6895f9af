"""In-flight benchmark: one worker holding many sleeping jobs; its memory and heartbeat cost.

Each repetition, on a fresh namespace:

1. one ``coldbrew worker bench.inflight_app:app`` starts with concurrency and
   prefetch >= ``--jobs``; after it is ready it idles ``--idle-seconds``: its
   RSS and CPU rate then are the idle baseline;
2. ``--jobs`` ``sleeper`` jobs (each sleeping ``--sleep`` s, longer than the
   measurement) are published per the message contract; the run waits until
   all of them are ``running`` in the jobs table;
3. with every job asleep, the worker's CPU is sampled every 25 ms (scheduler
   time from ``/proc``, microsecond resolution) while PostgreSQL's
   ``pg_stat_activity`` is polled every 20 ms for the worker's
   ``extend_leases`` UPDATE, which gives each heartbeat round's start and its
   statement time, until ``--rounds`` + 2 rounds were seen;
4. the worker is SIGTERMed (it releases the jobs) and the namespace dropped.

CPU per heartbeat round = (worker CPU over a window of exactly ``--rounds``
heartbeat periods, minus the same worker's CPU rate between heartbeats times
the window) / rounds. The first round after the fill is left out (warm-up).
See bench/README.md for the details and caveats.

    python bench/inflight.py                 # 10,000 jobs, 10 s heartbeats, 3 repeats
    python bench/inflight.py --quick         # 2,000 jobs, 2 s heartbeats, 1 repeat
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
from bench._common import (
    BenchError,
    MachineCPU,
    RunningWorker,
    Spread,
    machine_info,
    memory_kib,
    progress,
    run_main,
    scrape_metrics,
    worker_process,
)
from bench._profile import render_profile, start_profile, stop_profile
from bench._worker import (
    cpu_time,
    job_body,
    publish_bodies,
    services,
    status_counts,
    wait_status_count,
)
from bench.throughput import (
    DEFAULT_AMQP_URL,
    DEFAULT_DATABASE_URL,
    Config,
    namespace_for,
)

from coldbrew import logs
from coldbrew.migrate import connect_creating_database
from coldbrew.sql import QUERIES

APP_REF = "bench.inflight_app:app"
CPU_SAMPLE_SECONDS = 0.025
ACTIVITY_POLL_SECONDS = 0.02
WARMUP_ROUNDS = 1
RSS_TARGET_MB = 300
CPU_TARGET_MS = 100
BUSY_CPU_SECONDS = 0.001
"""A sample interval in which the worker used at least this much CPU is "busy" (idle: ~0.07 ms)."""


@dataclass
class InflightConfig:
    base: Config
    jobs: int
    sleep: float
    heartbeat: float
    lease: float
    rounds: int
    idle_seconds: float
    repeat: int
    profile_dir: Path | None = None
    extend_sql: str = field(default_factory=lambda: QUERIES["extend_leases"].text)

    @property
    def pre(self) -> float:
        """Seconds before a round's UPDATE counted as that round (its arrays are built then)."""
        return min(0.3, self.heartbeat / 10)

    @property
    def merge_gap(self) -> float:
        """Statements closer than this belong to one round (see ``LeaseWatcher.ordered``)."""
        return min(1.0, self.heartbeat / 4)

    @property
    def post(self) -> float:
        """Seconds after the UPDATE ended counted as that round (the per-job loop after it)."""
        return min(1.5, self.heartbeat / 4)


@dataclass(frozen=True, slots=True)
class Round:
    """One ``extend_leases`` statement seen in ``pg_stat_activity`` (epoch seconds)."""

    start: float
    db_seconds: float
    exact: bool
    """True: the end is the backend's ``state_change``; False: the start of its next query."""


class CpuSampler:
    """``(time.time(), worker CPU seconds)`` every 25 ms, from a background task."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.times: list[float] = []
        self.cpu: list[float] = []

    async def run(self) -> None:
        next_at = time.perf_counter()
        while True:
            self.times.append(time.time())
            self.cpu.append(cpu_time(self.pid))
            next_at += CPU_SAMPLE_SECONDS
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    def at(self, t: float) -> float:
        """Cumulative CPU at ``t``, linearly interpolated between samples."""
        times, cpu = self.times, self.cpu
        if not times or t < times[0] or t > times[-1]:
            raise BenchError(f"CPU at {t:.3f} is outside the sampled span")
        i = bisect.bisect_left(times, t)
        if times[i] == t or i == 0:
            return cpu[i]
        t0, t1 = times[i - 1], times[i]
        return cpu[i - 1] + (cpu[i] - cpu[i - 1]) * (t - t0) / (t1 - t0)

    def round_wall(self, start: float, end: float) -> float:
        """Wall time of a round whose UPDATE ran from ``start`` to ``end``, worker side.

        Extends the UPDATE back over the unbroken run of busy sample intervals
        (>= 1 ms of CPU in 25 ms) that leads into it (building and encoding
        the arrays) and forward over the one that follows it (decoding the
        rows, the per-job loop). Resolution: one sample interval each side.
        """
        times = self.times
        if not times or start < times[0] or end >= times[-1]:
            raise BenchError("round outside the sampled span")

        def busy(k: int) -> bool:
            return self.cpu[k] - self.cpu[k - 1] >= BUSY_CPU_SECONDS

        first, last = start, end
        k = bisect.bisect_right(times, start)  # interval k = [times[k-1], times[k]] holds start
        if busy(k):
            while k > 1 and busy(k - 1):
                k -= 1
            first = times[k - 1]
        k = bisect.bisect_right(times, end)
        if busy(k):
            while k + 1 < len(times) and busy(k + 1):
                k += 1
            last = times[k]
        return last - first


class LeaseWatcher:
    """Polls ``pg_stat_activity`` for the worker's ``extend_leases`` statements.

    A heartbeat of thousands of rows runs for tens of ms, so a 20 ms poll
    sees it active; it ended at its backend's ``state_change`` when next seen
    idle, or (asyncpg's pool runs its reset query right after) no later than
    that backend's next ``query_start``.
    """

    SQL = (
        "SELECT pid, state, extract(epoch FROM query_start)::float8 AS started, "
        "extract(epoch FROM state_change)::float8 AS changed, "
        "left(query, 120) = left($1::text, 120) AS is_extend "
        "FROM pg_stat_activity WHERE application_name = $2"
    )

    def __init__(self, conn: asyncpg.Connection, namespace: str, extend_sql: str) -> None:
        self.conn = conn
        self.application_name = f"coldbrew:{namespace}"
        self.extend_sql = extend_sql
        self.rounds: list[Round] = []
        self.polls = 0
        self._open: dict[int, float] = {}
        self._seen: set[tuple[int, float]] = set()

    async def run(self) -> None:
        next_at = time.perf_counter()
        while True:
            rows = await self.conn.fetch(self.SQL, self.extend_sql, self.application_name)
            self.polls += 1
            for row in rows:
                self._observe(row)
            next_at += ACTIVITY_POLL_SECONDS
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    def _observe(self, row: asyncpg.Record) -> None:
        pid, state, started, changed = row["pid"], row["state"], row["started"], row["changed"]
        if started is None:
            return
        if row["is_extend"]:
            key = (pid, started)
            if state == "active":
                if key not in self._seen:
                    self._seen.add(key)
                    self._open[pid] = started
            elif key not in self._seen or self._open.get(pid) == started:
                self._seen.add(key)
                self._open.pop(pid, None)
                self.rounds.append(Round(started, (changed or started) - started, True))
        elif pid in self._open and started > self._open[pid]:
            begun = self._open.pop(pid)
            self.rounds.append(Round(begun, started - begun, False))

    def ordered(self, merge_gap: float) -> list[Round]:
        """Rounds in time order; a statement starting < ``merge_gap`` after the last ended joins it.

        A pool connection's first heartbeat shows as a Parse/Describe step, then the execution.
        """
        merged: list[Round] = []
        for r in sorted(self.rounds, key=lambda r: r.start):
            if merged and r.start - (merged[-1].start + merged[-1].db_seconds) < merge_gap:
                last = merged[-1]
                end = max(last.start + last.db_seconds, r.start + r.db_seconds)
                merged[-1] = Round(last.start, end - last.start, last.exact and r.exact)
            else:
                merged.append(r)
        return merged


# --- one run ---------------------------------------------------------------------------------


def worker_settings(cfg: InflightConfig) -> dict[str, str]:
    return {
        "COLDBREW_CONCURRENCY": str(cfg.jobs),
        "COLDBREW_PREFETCH": str(min(cfg.jobs, 65_535)),
        "COLDBREW_HEARTBEAT_SECONDS": f"{cfg.heartbeat:g}",
        "COLDBREW_LEASE_SECONDS": f"{cfg.lease:g}",
        "COLDBREW_SHUTDOWN_GRACE_SECONDS": "1",
        "COLDBREW_LOG_LEVEL": "warning",
    }


async def run_once(cfg: InflightConfig, index: int, *, profile: bool) -> dict[str, Any]:
    label = f"run #{index + 1}"
    stop_times: dict[str, float] = {}
    async with namespace_for(cfg.base, label) as namespace:
        conn = await asyncpg.connect(cfg.base.database_url)
        watch_conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with worker_process_for(cfg, namespace, label, stop_times) as worker:
                result = await measure(cfg, conn, watch_conn, namespace, worker, index, profile)
                progress(f"{label}: stopping the worker (SIGTERM: it releases {cfg.jobs} jobs)")
            # a graceful stop hands every job back as queued; still running = not released
            result["statuses_after_stop"] = await status_counts(conn, namespace)
        finally:
            await conn.close()
            await watch_conn.close()
    result["stop_seconds"] = stop_times.get("stop_seconds")
    progress(
        f"{label}: worker exited {result['stop_seconds']:.1f} s after SIGTERM; jobs then: "
        f"{result['statuses_after_stop']}"
    )
    return result


def worker_process_for(
    cfg: InflightConfig, namespace: str, label: str, stop_times: dict[str, float]
) -> contextlib.AbstractAsyncContextManager[RunningWorker]:
    return worker_process(
        cfg.base,
        namespace,
        label,
        app_ref=APP_REF,
        extra_env=worker_settings(cfg),
        ready_timeout=90.0,
        stop_grace=120.0,
        stop_times=stop_times,
    )


async def measure(
    cfg: InflightConfig,
    conn: asyncpg.Connection,
    watch_conn: asyncpg.Connection,
    namespace: str,
    worker: RunningWorker,
    index: int,
    profile: bool,
) -> dict[str, Any]:
    label = f"run #{index + 1}"
    pid = worker.pid
    progress(f"{label}: worker ready (pid {pid}); idling {cfg.idle_seconds:g} s")
    await asyncio.sleep(1.0)  # let start-up work (first stats refresh, relay pass) pass
    idle_t0, idle_c0 = time.time(), cpu_time(pid)
    await asyncio.sleep(cfg.idle_seconds)
    idle_rate = (cpu_time(pid) - idle_c0) / (time.time() - idle_t0)
    idle_mem = memory_kib(pid)

    body = job_body("sleeper", {"seconds": cfg.sleep})
    published_at = time.time()
    publish_seconds = await publish_bodies(
        cfg.base.amqp_url, namespace, body, cfg.jobs, id_prefix=f"{namespace}-{index}"
    )
    progress(f"{label}: published {cfg.jobs} in {publish_seconds:.1f} s; waiting for all running")
    all_running = await wait_status_count(
        conn,
        namespace,
        "running",
        cfg.jobs,
        worker,
        poll=0.25,
        timeout=120 + cfg.jobs / 100,
        label=label,
    )
    fill_seconds = all_running - published_at
    full_mem = memory_kib(pid)
    progress(
        f"{label}: all {cfg.jobs} running {fill_seconds:.1f} s after the first publish; "
        f"VmRSS {full_mem['VmRSS'] / 1024:.0f} MiB; sampling heartbeats"
    )
    before = await scrape_metrics(worker.port)
    machine0, machine_t0 = MachineCPU.read(), time.perf_counter()
    sampler = CpuSampler(pid)
    watcher = LeaseWatcher(watch_conn, namespace, cfg.extend_sql)
    spy = await start_profile(cfg.profile_dir, pid, "inflight-worker") if profile else None
    tasks = [asyncio.create_task(sampler.run()), asyncio.create_task(watcher.run())]
    wanted = WARMUP_ROUNDS + cfg.rounds + 1
    deadline = time.perf_counter() + (wanted + 1) * (cfg.heartbeat + 1.5) + 10
    try:
        while len(watcher.ordered(cfg.merge_gap)) < wanted and time.perf_counter() < deadline:
            if worker.process.returncode is not None:
                raise BenchError(f"{label}: worker exited {worker.process.returncode}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(cfg.post + 0.2)  # the last round's per-job loop, then a margin
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        profile_summary = await stop_profile(spy) if spy is not None else None
    machine = MachineCPU.read() - machine0
    span = time.perf_counter() - machine_t0
    after = await scrape_metrics(worker.port)
    end_mem = memory_kib(pid)
    counts = await status_counts(conn, namespace)
    result = analyse(cfg, sampler, watcher.ordered(cfg.merge_gap), idle_rate)
    result["statements_seen"] = len(watcher.rounds)
    extensions = after.get("coldbrew_lease_extensions_total", 0) - before.get(
        "coldbrew_lease_extensions_total", 0
    )
    finished = after.get("coldbrew_jobs_finished_total", 0) - before.get(
        "coldbrew_jobs_finished_total", 0
    )
    result |= {
        "publish_seconds": publish_seconds,
        "fill_seconds": fill_seconds,
        "idle_cpu_ms_per_s": idle_rate * 1000,
        "rss_idle_kib": idle_mem["VmRSS"],
        "rss_full_kib": full_mem["VmRSS"],
        "rss_loaded_kib": end_mem["VmRSS"],
        "hwm_kib": end_mem["VmHWM"],
        "kib_per_job": (end_mem["VmRSS"] - idle_mem["VmRSS"]) / cfg.jobs,
        "rounds_by_metric": extensions / cfg.jobs,
        "jobs_finished_in_span": finished,
        "leases_lost": after.get("coldbrew_leases_lost_total", 0),
        "jobs_in_flight_metric": after.get("coldbrew_jobs_in_flight"),
        "heartbeat_lag_s": after.get("coldbrew_heartbeat_lag_seconds"),
        "statuses_after": counts,
        "activity_polls": watcher.polls,
        "sampled_seconds": span,
        "machine_busy_cores": machine.busy / span,
        "machine_steal_cores": machine.steal / span,
    }
    if profile_summary is not None:
        result["profile"] = profile_summary
    if counts.get("running") != cfg.jobs or finished:
        result["warning"] = (
            f"not every job was asleep through the span: {counts}, {finished:g} finished "
            "(raise --sleep)"
        )
    progress(
        f"{label}: {result['rounds_used']} rounds; CPU/round {fmt_ms(result['cpu_ms_per_round'])} "
        f"ms (vs idle baseline {fmt_ms(result['cpu_ms_per_round_vs_idle'])}), "
        f"UPDATE {fmt_ms(median_or_none(result['db_ms']))} ms; "
        f"VmRSS {end_mem['VmRSS'] / 1024:.0f} MiB"
    )
    return result


def analyse(
    cfg: InflightConfig, sampler: CpuSampler, rounds: list[Round], idle_rate: float
) -> dict[str, Any]:
    """CPU per heartbeat round from the CPU samples and the rounds' start times.

    Window: from ``pre`` before round 1's UPDATE to ``pre`` before round K+1's
    (round 0 is the warm-up), so it holds exactly K rounds and K periods of
    everything else. The "quiet" rate is the worker's CPU rate in the gaps
    between rounds (``post`` after an UPDATE ended until ``pre`` before the
    next began); it is subtracted over the whole window.
    """
    pre, post, k = cfg.pre, cfg.post, cfg.rounds
    first, last = sampler.times[0], sampler.times[-1]
    result: dict[str, Any] = {
        "rounds_seen": len(rounds),
        "db_ms": [r.db_seconds * 1000 for r in rounds],
        "db_exact": [r.exact for r in rounds],
        "periods_s": [b.start - a.start for a, b in itertools.pairwise(rounds)],
        "rounds_used": 0,
        "cpu_ms_per_round": None,
        "cpu_ms_per_round_vs_idle": None,
        "quiet_cpu_ms_per_s": None,
        "burst_cpu_ms": [],
        "round_wall_ms": [],
    }
    if len(rounds) < WARMUP_ROUNDS + 2:
        return result
    k = min(k, len(rounds) - WARMUP_ROUNDS - 1)
    inside = rounds[WARMUP_ROUNDS : WARMUP_ROUNDS + k + 1]  # rounds 1..K and the K+1-th
    w0, w1 = inside[0].start - pre, inside[-1].start - pre
    gap_cpu = gap_time = 0.0
    for this, nxt in itertools.pairwise(inside):
        g0, g1 = this.start + this.db_seconds + post, nxt.start - pre
        if g1 > g0:
            gap_cpu += sampler.at(g1) - sampler.at(g0)
            gap_time += g1 - g0
    quiet = gap_cpu / gap_time if gap_time > 0 else idle_rate
    window_cpu = sampler.at(w1) - sampler.at(w0)
    result |= {
        "rounds_used": k,
        "window_s": w1 - w0,
        "quiet_cpu_ms_per_s": quiet * 1000,
        "cpu_ms_per_round": (window_cpu - quiet * (w1 - w0)) / k * 1000,
        "cpu_ms_per_round_vs_idle": (window_cpu - idle_rate * (w1 - w0)) / k * 1000,
    }
    for r in rounds:
        b0, b1 = r.start - pre, r.start + r.db_seconds + post
        if b0 < first or b1 > last:
            continue
        result["burst_cpu_ms"].append((sampler.at(b1) - sampler.at(b0) - quiet * (b1 - b0)) * 1000)
        result["round_wall_ms"].append(sampler.round_wall(r.start, r.start + r.db_seconds) * 1000)
    return result


# --- the whole run ---------------------------------------------------------------------------


async def run(cfg: InflightConfig) -> dict[str, Any]:
    logs.configure("json", "warning")
    conn = await connect_creating_database(cfg.base.database_url)
    await conn.close()
    machine = await machine_info(cfg.base.amqp_url, cfg.base.database_url)
    progress(
        f"{cfg.jobs} sleeping jobs x {cfg.repeat} runs, heartbeat {cfg.heartbeat:g} s, "
        f"{cfg.rounds} measured rounds, jobs sleep {cfg.sleep:g} s"
    )
    runs = []
    for index in range(cfg.repeat):
        profile = cfg.profile_dir is not None and index == cfg.repeat - 1
        runs.append(await run_once(cfg, index, profile=profile))
    return summarize(cfg, machine, runs)


def spread(values: list[float]) -> dict[str, float] | None:
    return Spread.of(values).as_dict() if values else None


def summarize(
    cfg: InflightConfig, machine: dict[str, Any], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    def per_run(key: str) -> dict[str, float] | None:
        return spread([r[key] for r in runs if r.get(key) is not None])

    def pooled(key: str) -> dict[str, float] | None:
        return spread([v for r in runs for v in r[key]])

    rss_loaded = per_run("rss_loaded_kib")
    rss_met = None if rss_loaded is None else rss_loaded["max"] * 1024 <= RSS_TARGET_MB * 1e6
    cpu = per_run("cpu_ms_per_round")
    bursts = pooled("burst_cpu_ms")
    return {
        "config": {
            "jobs": cfg.jobs,
            "sleep": cfg.sleep,
            "heartbeat": cfg.heartbeat,
            "lease": cfg.lease,
            "rounds": cfg.rounds,
            "warmup_rounds": WARMUP_ROUNDS,
            "idle_seconds": cfg.idle_seconds,
            "repeat": cfg.repeat,
            "pre_seconds": cfg.pre,
            "post_seconds": cfg.post,
            "cpu_sample_seconds": CPU_SAMPLE_SECONDS,
            "activity_poll_seconds": ACTIVITY_POLL_SECONDS,
        },
        "machine": machine,
        "rss_idle_kib": per_run("rss_idle_kib"),
        "rss_loaded_kib": rss_loaded,
        "hwm_kib": per_run("hwm_kib"),
        "kib_per_job": per_run("kib_per_job"),
        "cpu_ms_per_round": cpu,
        "cpu_ms_per_round_vs_idle": per_run("cpu_ms_per_round_vs_idle"),
        "burst_cpu_ms": bursts,
        "db_ms": pooled("db_ms"),
        "round_wall_ms": pooled("round_wall_ms"),
        "quiet_cpu_ms_per_s": per_run("quiet_cpu_ms_per_s"),
        "idle_cpu_ms_per_s": per_run("idle_cpu_ms_per_s"),
        "fill_seconds": per_run("fill_seconds"),
        "stop_seconds": per_run("stop_seconds"),
        "unreleased": spread([r["statuses_after_stop"].get("running", 0) for r in runs]),
        "targets": {
            "rss_mb": RSS_TARGET_MB,
            "rss_met": rss_met,
            "cpu_ms_per_round": CPU_TARGET_MS,
            "cpu_met": None if cpu is None else cpu["max"] <= CPU_TARGET_MS,
            "every_round_met": None if bursts is None else bursts["max"] <= CPU_TARGET_MS,
        },
        "runs": runs,
    }


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def render(result: dict[str, Any]) -> str:
    cfg, machine, targets = result["config"], result["machine"], result["targets"]

    def row(name: str, key: str, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
        value = result.get(key)
        if value is None:
            return f"{name:<44} {'n/a':>10}"
        med, low, high = (value[k] / scale for k in ("median", "min", "max"))
        return f"{name:<44} {med:>10.{digits}f} {low:>10.{digits}f} {high:>10.{digits}f}  {unit}"

    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    met = {True: "met", False: "MISSED", None: "not measured"}
    lines = [
        f"coldbrew in-flight: {cfg['jobs']:,} sleeping jobs in one worker, heartbeat "
        f"{cfg['heartbeat']:g} s (lease {cfg['lease']:g} s), {cfg['rounds']} measured rounds "
        f"after {cfg['warmup_rounds']} warm-up, {cfg['repeat']} runs",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}, {machine['ram_gib']} GiB; RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, Python {machine['python']}",
        "",
        f"{'':<44} {'median':>10} {'min':>10} {'max':>10}",
        row("worker VmRSS, idle (no jobs)", "rss_idle_kib", 1024, "MiB"),
        row("worker VmRSS, all jobs in flight", "rss_loaded_kib", 1024, "MiB"),
        row("worker VmHWM (peak)", "hwm_kib", 1024, "MiB"),
        row("memory per in-flight job", "kib_per_job", 1, "KiB", 2),
        row("CPU per heartbeat round (window method)", "cpu_ms_per_round", 1, "ms"),
        row("  same, idle worker's rate as baseline", "cpu_ms_per_round_vs_idle", 1, "ms"),
        row("  single rounds (all runs pooled)", "burst_cpu_ms", 1, "ms"),
        row("extend_leases UPDATE in PostgreSQL", "db_ms", 1, "ms"),
        row("round wall time in the worker (~25 ms res.)", "round_wall_ms", 1, "ms"),
        row("worker CPU between heartbeats", "quiet_cpu_ms_per_s", 1, "ms/s"),
        row("worker CPU idle (no jobs)", "idle_cpu_ms_per_s", 1, "ms/s"),
        row("fill: first publish to all running", "fill_seconds", 1, "s"),
        row("SIGTERM to exit (releases every job)", "stop_seconds", 1, "s"),
        row("  jobs left running (not released) by it", "unreleased", 1, "", 0),
        "",
        f"target VmRSS <= {targets['rss_mb']} MB with all jobs in flight: "
        f"{met[targets['rss_met']]}",
        f"target CPU per heartbeat round <= {targets['cpu_ms_per_round']} ms: "
        f"{met[targets['cpu_met']]} (window method, every run); every single round: "
        f"{met[targets['every_round_met']]}",
    ]
    for index, run in enumerate(result["runs"]):
        lines.append(
            f"run {index + 1}: rounds seen {run['rounds_seen']} (by lease metric "
            f"{run['rounds_by_metric']:.2f}), periods "
            + ", ".join(f"{p:.2f}" for p in run["periods_s"])
            + f" s; UPDATE ms {', '.join(f'{v:.0f}' for v in run['db_ms'])}; "
            f"single-round CPU ms {', '.join(f'{v:.0f}' for v in run['burst_cpu_ms'])}; "
            f"machine busy {run['machine_busy_cores']:.2f} cores, "
            f"steal {run['machine_steal_cores']:.2f}; leases lost {run['leases_lost']:g}"
        )
        if "warning" in run:
            lines.append(f"  WARNING: {run['warning']}")
        if "profile" in run:
            lines.extend(render_profile(run["profile"], "the worker during the sampled span"))
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, help="sleeping jobs (10000; --quick 2000)")
    parser.add_argument(
        "--heartbeat", type=float, help="COLDBREW_HEARTBEAT_SECONDS (10; --quick 2)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured heartbeat rounds (3)")
    parser.add_argument("--repeat", type=int, help="runs, each on a fresh worker (3; --quick 1)")
    parser.add_argument(
        "--sleep", type=float, help="seconds each job sleeps (default: enough for the measurement)"
    )
    parser.add_argument(
        "--idle-seconds", type=float, help="idle time of the worker before loading (= heartbeat)"
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run for development")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--profile", metavar="DIR", type=Path, help="py-spy the worker during the last run's span"
    )
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = parser.parse_args(argv)
    quick = args.quick
    args.jobs = args.jobs or (2_000 if quick else 10_000)
    args.heartbeat = args.heartbeat or (2.0 if quick else 10.0)
    args.repeat = args.repeat or (1 if quick else 3)
    args.idle_seconds = args.idle_seconds or max(3.0, args.heartbeat)
    if args.jobs < 1 or args.repeat < 1 or args.rounds < 1 or args.heartbeat <= 0:
        parser.error("--jobs, --repeat, --rounds and --heartbeat must be positive")
    needed = 20 + args.jobs / 1000 + (WARMUP_ROUNDS + args.rounds + 2) * (args.heartbeat + 1.5)
    args.sleep = args.sleep or float(math.ceil(needed / 10) * 10)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    def config(workdir: Path) -> InflightConfig:
        return InflightConfig(
            base=services(args.amqp_url, args.database_url, workdir),
            jobs=args.jobs,
            sleep=args.sleep,
            heartbeat=args.heartbeat,
            lease=max(30.0, 3 * args.heartbeat),
            rounds=args.rounds,
            idle_seconds=args.idle_seconds,
            repeat=args.repeat,
            profile_dir=args.profile,
        )

    return run_main(config, run, render, json_output=args.json, workdir_prefix="cbbench-")


if __name__ == "__main__":
    sys.exit(main())
