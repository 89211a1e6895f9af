"""Process-pool benchmark: CPU-bound jobs through coldbrew against a plain ProcessPoolExecutor.

Every side runs the same function, ``bench.cpu_app.burn`` (pure-Python
arithmetic, ~30 ms a call here), ``--jobs`` times on ``--processes`` child
processes, timed with the children already started:

* **executor**: ``concurrent.futures.ProcessPoolExecutor(P)`` (spawn, like
  coldbrew's pool) in this process; all jobs submitted at once, timed from
  the first ``submit`` to the last result;
* **pool**: coldbrew's ``ProcessPool(P, "bench.cpu_app:app")`` driven
  directly from this process's event loop (no broker, no database): the
  pool's own dispatch and IPC cost;
* **coldbrew**: end to end: the jobs published per the message contract, then
  one ``coldbrew worker bench.cpu_app:app`` with ``COLDBREW_PROCESSES=P``;
  timed from ``/readyz`` answering (or the first job's ``started_at``, if
  earlier) until the last job's ``finished_at``.

The sides alternate order every round (executor first, then coldbrew first);
the ratios coldbrew/executor and pool/executor are taken per round and
medianed. The results table goes to stdout (or JSON with ``--json``),
progress to stderr; everything created is removed, on errors and Ctrl-C too.

    python bench/procpool.py                 # 400 jobs x 3 rounds, P = cores
    python bench/procpool.py --quick         # 60 jobs, 1 round
    python bench/procpool.py --process-max-memory-mb 2048 --process-max-jobs 1000
                                             # the pool and the worker with both limits on
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import uvloop
from bench import cpu_app
from bench._common import (
    BenchError,
    MachineCPU,
    Spread,
    cpu_by_command,
    cpu_delta,
    machine_info,
    progress,
    run_main,
    worker_process,
)
from bench._profile import render_profile, start_profile, stop_profile
from bench._worker import (
    cpu_time,
    declare_default_queue,
    job_body,
    publish_bodies,
    services,
    status_counts,
    wait_status_count,
)
from bench.throughput import (
    COMMITS_SQL,
    DEFAULT_AMQP_URL,
    DEFAULT_DATABASE_URL,
    SERVICE_COMMANDS,
    Config,
    namespace_for,
)

from coldbrew import logs
from coldbrew.migrate import connect_creating_database, quote_ident
from coldbrew.procpool import ProcessPool

APP_REF = "bench.cpu_app:app"
TARGET_RATIO = 0.95  # issue #19 item 4 (issue #5 asked for 0.9)
SIDES = ("executor", "pool", "coldbrew")


@dataclass
class PoolConfig:
    base: Config
    jobs: int
    processes: int
    n: int
    concurrency: int
    repeat: int
    direct: bool
    profile_dir: Path | None = None
    max_memory_mb: int = 0
    """``ProcessPool(max_memory_mb=)`` and the worker's ``COLDBREW_PROCESS_MAX_MEMORY_MB``."""
    max_jobs: int = 0
    """``ProcessPool(max_jobs=)`` and the worker's ``COLDBREW_PROCESS_MAX_JOBS``."""


@dataclass
class SideRun:
    """One side's run of ``jobs`` calls of ``burn``."""

    side: str
    jobs: int
    seconds: float
    parent_cpu: float
    """The dispatching process: this bench (executor, pool) or the worker's main process."""
    children_cpu: float
    services_cpu: float
    """All postgres and beam.smp processes on the machine (other users' too)."""
    machine_busy_cores: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass(frozen=True, slots=True)
class Snapshot:
    """CPU readings at one instant (``time.time()`` clock, to compare with PostgreSQL's)."""

    at: float
    parent: float
    children: float
    services: dict[int, tuple[str, float]]
    machine: MachineCPU

    @classmethod
    def take(cls, parent: float, children: list[int]) -> Snapshot:
        return cls(
            time.time(),
            parent,
            sum(cpu_time(pid) for pid in children),
            cpu_by_command(SERVICE_COMMANDS),
            MachineCPU.read(),
        )


def measured(
    side: str, jobs: int, start: Snapshot, end: Snapshot, seconds: float, **extra: Any
) -> SideRun:
    services_cpu = sum(cpu_delta(start.services, end.services).values())
    return SideRun(
        side,
        jobs,
        seconds,
        end.parent - start.parent,
        end.children - start.children,
        services_cpu,
        (end.machine - start.machine).busy / (end.at - start.at),
        extra,
    )


# --- the sides ----------------------------------------------------------------------------------


def run_executor(cfg: PoolConfig) -> SideRun:
    """The reference: the same function through a plain ``ProcessPoolExecutor``.

    Blocking (this is what its users write); nothing else runs meanwhile.
    """
    executor = ProcessPoolExecutor(cfg.processes, mp_context=multiprocessing.get_context("spawn"))
    try:
        # blocking calls make the executor start every process before the clock starts
        pids = sorted(set(executor.map(cpu_app.warm, [0.3] * (2 * cfg.processes))))
        if len(pids) != cfg.processes:
            raise BenchError(f"executor started {len(pids)} processes, not {cfg.processes}")
        start = Snapshot.take(time.process_time(), pids)
        began = time.perf_counter()
        futures = [executor.submit(cpu_app.burn, None, cfg.n) for _ in range(cfg.jobs)]
        for future in futures:
            future.result()
        seconds = time.perf_counter() - began
        end = Snapshot.take(time.process_time(), pids)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return measured("executor", cfg.jobs, start, end, seconds)


class NullHost:
    """The parent-side services a pool job's context may call; ``burn`` calls none of them."""

    def progress(self, fraction: float | None, message: str | None) -> None:
        return None

    async def checkpoint(self, state: Any) -> None:
        return None

    async def once(self, name: str) -> bool:
        return True


async def run_pool(cfg: PoolConfig, index: int) -> SideRun:
    """coldbrew's ``ProcessPool`` alone, from this process's event loop (uvloop, as the worker)."""
    pool = ProcessPool(
        cfg.processes, APP_REF, max_memory_mb=cfg.max_memory_mb, max_jobs=cfg.max_jobs
    )
    await pool.start()
    try:
        pids = pool.pids
        host = NullHost()

        def info(job: int) -> dict[str, Any]:
            return {"job_id": f"pool-{index}-{job}", "type": "burn", "attempt": 1}

        start = Snapshot.take(time.process_time(), pids)
        began = time.perf_counter()
        await asyncio.gather(
            *(
                pool.run("burn", {"n": cfg.n}, info(job), host, timeout=None)
                for job in range(cfg.jobs)
            )
        )
        seconds = time.perf_counter() - began
        end = Snapshot.take(time.process_time(), pids)
    finally:
        await pool.close(5.0)
    return measured("pool", cfg.jobs, start, end, seconds)


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (the pool's processes and multiprocessing's resource tracker)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


async def run_coldbrew(cfg: PoolConfig, index: int, *, profile: bool = False) -> SideRun:
    """End to end: publish, then one worker with ``COLDBREW_PROCESSES=P`` runs every job."""
    label = f"coldbrew #{index + 1}"
    settings = {
        "COLDBREW_PROCESSES": str(cfg.processes),
        "COLDBREW_CONCURRENCY": str(cfg.concurrency),
        "COLDBREW_LOG_LEVEL": "warning",
        "COLDBREW_PROCESS_MAX_MEMORY_MB": str(cfg.max_memory_mb),
        "COLDBREW_PROCESS_MAX_JOBS": str(cfg.max_jobs),
    }
    async with namespace_for(cfg.base, label) as namespace:
        await declare_default_queue(cfg.base.amqp_url, namespace)
        body = job_body("burn", {"n": cfg.n})
        await publish_bodies(
            cfg.base.amqp_url, namespace, body, cfg.jobs, id_prefix=f"{namespace}-{index}"
        )
        conn = await asyncpg.connect(cfg.base.database_url)
        polls: list[int] = []
        try:
            commits0 = await conn.fetchval(COMMITS_SQL)
            async with worker_process(
                cfg.base,
                namespace,
                label,
                app_ref=APP_REF,
                extra_env=settings,
                ready_timeout=90.0,
                stop_grace=30.0,
            ) as worker:
                children = child_pids(worker.pid)
                start = Snapshot.take(cpu_time(worker.pid), children)
                spy = None
                if profile:
                    spy = await start_profile(cfg.profile_dir, worker.pid, "procpool-worker")
                try:
                    await wait_status_count(
                        conn,
                        namespace,
                        "succeeded",
                        cfg.jobs,
                        worker,
                        poll=0.2,
                        timeout=120 + cfg.jobs,
                        label=label,
                        polls=polls,
                    )
                finally:
                    end = Snapshot.take(cpu_time(worker.pid), children)
                    summary = await stop_profile(spy) if spy is not None else None
            await asyncio.sleep(0.6)  # exited backends' statistics are flushed at exit
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            # the worker's transactions from start to exit; our polls and these reads taken off
            commits = await conn.fetchval(COMMITS_SQL) - commits0 - len(polls) - 2
            table = f"{quote_ident(namespace)}.jobs"
            row = await conn.fetchrow(
                "SELECT extract(epoch FROM min(started_at))::float8 AS first, "
                "extract(epoch FROM max(finished_at))::float8 AS last, "
                f"count(*) FILTER (WHERE attempt > 1) AS retried FROM {table}"
            )
            statuses = await status_counts(conn, namespace)
        finally:
            await conn.close()
    # the worker claims (and may start) jobs a moment before /readyz answers: the clock
    # starts at whichever came first, so that no job runs before it
    began = min(worker.ready_at, row["first"])
    seconds = row["last"] - began
    extra = {
        "first_start_to_last_finish": row["last"] - row["first"],
        "first_start_before_ready": worker.ready_at - row["first"],
        "retried": row["retried"],
        "statuses": statuses,
        "child_processes": len(children),
        "commits_per_job": commits / cfg.jobs,
    }
    if summary is not None:
        extra["profile"] = summary
    if row["retried"] or set(statuses) != {"succeeded"}:
        progress(f"{label}: WARNING retried or not succeeded: {statuses}, {row['retried']} retried")
    return measured("coldbrew", cfg.jobs, start, end, seconds, **extra)


# --- the run --------------------------------------------------------------------------------------


async def run_side(cfg: PoolConfig, side: str, index: int) -> SideRun:
    if side == "executor":
        return run_executor(cfg)
    if side == "pool":
        return await run_pool(cfg, index)
    profile = cfg.profile_dir is not None and index == cfg.repeat - 1
    return await run_coldbrew(cfg, index, profile=profile)


def calibrate(n: int) -> float:
    """CPU ms of one ``burn(n)`` here, best of 3 (CPU time: a busy machine does not inflate it)."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        cpu_app.burn(None, n)
        best = min(best, time.process_time() - began)
    return best * 1000


async def run(cfg: PoolConfig) -> dict[str, Any]:
    logs.configure("json", "warning")
    conn = await connect_creating_database(cfg.base.database_url)
    await conn.close()
    machine = await machine_info(cfg.base.amqp_url, cfg.base.database_url)
    burn_ms = calibrate(cfg.n)
    progress(
        f"{cfg.jobs} jobs x {cfg.repeat} rounds on {cfg.processes} processes; "
        f"burn(n={cfg.n:,}) takes {burn_ms:.1f} ms here"
    )
    sides = [s for s in SIDES if cfg.direct or s != "pool"]
    runs: dict[str, list[SideRun]] = {side: [] for side in sides}
    for index in range(cfg.repeat):
        order = sides if index % 2 == 0 else sides[::-1]
        for side in order:
            result = await run_side(cfg, side, index)
            runs[side].append(result)
            progress(
                f"round {index + 1} {side}: {result.rate:,.1f} jobs/s ({result.seconds:.2f} s)"
            )
    return summarize(cfg, machine, burn_ms, runs)


def summarize(
    cfg: PoolConfig, machine: dict[str, Any], burn_ms: float, runs: dict[str, list[SideRun]]
) -> dict[str, Any]:
    def per_job_ms(values: list[float]) -> dict[str, float]:
        return Spread.of([v / cfg.jobs * 1000 for v in values]).as_dict()

    def side(results: list[SideRun]) -> dict[str, Any]:
        return {
            "rate": Spread.of([r.rate for r in results]).as_dict(),
            "seconds": Spread.of([r.seconds for r in results]).as_dict(),
            "parent_cpu_ms_per_job": per_job_ms([r.parent_cpu for r in results]),
            "children_cpu_ms_per_job": per_job_ms([r.children_cpu for r in results]),
            "services_cpu_ms_per_job": per_job_ms([r.services_cpu for r in results]),
            "machine_busy_cores": Spread.of([r.machine_busy_cores for r in results]).as_dict(),
            "runs": [asdict(r) | {"rate": r.rate} for r in results],
        }

    base = runs["executor"]
    ratios = {
        name: [r.rate / b.rate for r, b in zip(runs[name], base, strict=True)]
        for name in runs
        if name != "executor"
    }
    return {
        "config": {
            "jobs": cfg.jobs,
            "processes": cfg.processes,
            "n": cfg.n,
            "burn_ms": burn_ms,
            "concurrency": cfg.concurrency,
            "repeat": cfg.repeat,
            "process_max_memory_mb": cfg.max_memory_mb,
            "process_max_jobs": cfg.max_jobs,
        },
        "machine": machine,
        "sides": {name: side(results) for name, results in runs.items()},
        "ratios": {
            name: {"median": statistics.median(values), "per_round": values}
            for name, values in ratios.items()
        },
        "target_ratio": TARGET_RATIO,
    }


NAMES = {
    "executor": "ProcessPoolExecutor",
    "pool": "coldbrew ProcessPool",
    "coldbrew": "coldbrew worker",
}


def render(result: dict[str, Any]) -> str:
    cfg, machine = result["config"], result["machine"]
    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    lines = [
        f"coldbrew process pool: {cfg['jobs']:,} CPU-bound jobs (burn n={cfg['n']:,}, "
        f"{cfg['burn_ms']:.1f} ms each) on {cfg['processes']} processes, {cfg['repeat']} rounds; "
        f"worker concurrency {cfg['concurrency']}; pool limits: max memory "
        f"{cfg['process_max_memory_mb'] or 'off'} MB, max jobs {cfg['process_max_jobs'] or 'off'}",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}, {machine['ram_gib']} GiB; RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, Python {machine['python']}",
        "",
        f"{'':<21} {'jobs/s':>8} {'jobs/s':>13} {'run':>6} {'--- CPU ms/job ---':>26} "
        f"{'machine':>8}",
        f"{'side':<21} {'median':>8} {'min-max':>13} {'s':>6} {'parent':>8} {'children':>8} "
        f"{'pg+rmq':>8} {'busy':>8}",
    ]
    for name, side in result["sides"].items():
        rate = side["rate"]
        spread = f"{rate['min']:,.1f}-{rate['max']:,.1f}"
        lines.append(
            f"{NAMES[name]:<21} {rate['median']:>8,.1f} {spread:>13} "
            f"{side['seconds']['median']:>6.2f} {side['parent_cpu_ms_per_job']['median']:>8.2f} "
            f"{side['children_cpu_ms_per_job']['median']:>8.2f} "
            f"{side['services_cpu_ms_per_job']['median']:>8.2f} "
            f"{side['machine_busy_cores']['median']:>8.2f}"
        )
    lines += [
        "(medians; parent = this bench process for the executor and the pool, the worker's main",
        " process for coldbrew; pg+rmq = every postgres and beam.smp process on the machine)",
        "",
    ]
    target = result["target_ratio"]
    for name, ratio in result["ratios"].items():
        rounds = ", ".join(f"{r:.3f}" for r in ratio["per_round"])
        verdict = "met" if ratio["median"] >= target else "MISSED"
        suffix = f"  target >= {target}: {verdict}" if name == "coldbrew" else ""
        lines.append(
            f"ratio {NAMES[name]} / executor: {ratio['median']:.3f}  [rounds: {rounds}]{suffix}"
        )
    runs = result["sides"]["coldbrew"]["runs"]
    commits = statistics.median(r["extra"]["commits_per_job"] for r in runs)
    lines.append(
        f"coldbrew in PostgreSQL: {commits:.2f} commits per job (median; the worker's from start "
        "to exit, from pg_stat_database; claim and completion batches are one commit each)"
    )
    early = [r["extra"]["first_start_before_ready"] * 1000 for r in runs]
    lines.append(
        "coldbrew's clock: from /readyz or the first job's started_at, whichever came first, "
        "to the last finished_at; the first job started "
        + ", ".join(f"{ms:.0f}" for ms in early)
        + " ms before /readyz answered"
    )
    for run in runs:
        if "profile" in run["extra"]:
            lines.extend(render_profile(run["extra"]["profile"], "the worker's main process"))
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, help="jobs per side and round (400; --quick 60)")
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="pool size P (cores)"
    )
    parser.add_argument(
        "--n", type=int, default=250_000, help="rounds of arithmetic per job (250000: ~30 ms)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=100, help="COLDBREW_CONCURRENCY of the worker (100)"
    )
    parser.add_argument("--repeat", type=int, help="rounds of all sides (3; --quick 1)")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct ProcessPool side")
    parser.add_argument(
        "--process-max-memory-mb",
        type=int,
        default=0,
        help="per-child memory limit of the pool and the worker (0: off, the default)",
    )
    parser.add_argument(
        "--process-max-jobs",
        type=int,
        default=0,
        help="recycle each pool child after this many jobs (0: never, the default)",
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run for development")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--profile", metavar="DIR", type=Path, help="py-spy the worker in the last coldbrew run"
    )
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (60 if args.quick else 400)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if min(args.jobs, args.repeat, args.processes, args.n, args.concurrency) < 1:
        parser.error("--jobs, --repeat, --processes, --n and --concurrency must be positive")
    if min(args.process_max_memory_mb, args.process_max_jobs) < 0:
        parser.error("--process-max-memory-mb and --process-max-jobs must be 0 (off) or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    def config(workdir: Path) -> PoolConfig:
        return PoolConfig(
            base=services(args.amqp_url, args.database_url, workdir),
            jobs=args.jobs,
            processes=args.processes,
            n=args.n,
            concurrency=args.concurrency,
            repeat=args.repeat,
            direct=not args.no_direct,
            profile_dir=args.profile,
            max_memory_mb=args.process_max_memory_mb,
            max_jobs=args.process_max_jobs,
        )

    return run_main(
        config,
        run,
        render,
        json_output=args.json,
        workdir_prefix="cbbench-",
        loop_factory=uvloop.new_event_loop,
    )


if __name__ == "__main__":
    sys.exit(main())
