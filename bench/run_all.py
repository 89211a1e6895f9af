"""``make bench``: every benchmark, one after another, each printing its own table.

The scenarios of the cost-per-job issue (#5) and the fairness issue (#4):

* ``throughput`` -- no-op drain, coldbrew against the raw aio-pika loop;
* ``peers``      -- the same drain against Celery, Dramatiq and taskiq;
* ``latency``    -- publish-to-start latency at a steady rate;
* ``inflight``   -- 10,000 sleeping jobs: memory and heartbeat CPU;
* ``procpool``   -- CPU-bound jobs: the process pool against ProcessPoolExecutor;
* ``fairness``   -- burst, priority, aging, caps and scale.

Each runs as its own process (a crash in one does not hide the others' figures)
and holds ``/tmp/coldbrew-heavy.lock`` while it runs, so two heavy runs on this
shared machine never overlap. Extra arguments after ``--`` go to every script
(``--quick`` for a short pass). The exit status is the number of scripts that
failed to run (a missed target is a figure, not a failure).

    python bench/run_all.py                  # everything, about half an hour
    python bench/run_all.py --only peers,latency -- --quick
"""

from __future__ import annotations

import argparse
import fcntl
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = ("throughput", "peers", "latency", "inflight", "procpool", "fairness")
LOCK = Path("/tmp/coldbrew-heavy.lock")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", help=f"comma-separated subset of {','.join(SCRIPTS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    return args, rest


def main(argv: list[str] | None = None) -> int:
    args, passthrough = parse_args(argv)
    chosen = list(SCRIPTS) if not args.only else [s.strip() for s in args.only.split(",")]
    unknown = [s for s in chosen if s not in SCRIPTS]
    if unknown:
        print(f"run_all: unknown benchmark(s) {unknown}; choose from {SCRIPTS}", file=sys.stderr)
        return 2
    extra = [*passthrough, *(["--quick"] if args.quick else [])]
    failed: list[str] = []
    timings: list[tuple[str, float, int]] = []
    for name in chosen:
        script = BENCH / f"{name}.py"
        if not script.exists():
            print(f"\n=== {name}: {script.name} is missing; skipped ===", flush=True)
            failed.append(name)
            continue
        print(f"\n=== {name}: python bench/{script.name} {' '.join(extra)} ===", flush=True)
        started = time.monotonic()
        with LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            code = subprocess.call([sys.executable, str(script), *extra])
        timings.append((name, time.monotonic() - started, code))
        if code != 0:
            failed.append(name)
    print("\n=== summary ===")
    for name, seconds, code in timings:
        print(f"{name:<12} {'ok' if code == 0 else f'exit {code}':<8} {seconds:7.1f} s")
    if failed:
        print(f"failed to run: {', '.join(failed)}")
    return len(failed)


if __name__ == "__main__":
    sys.exit(main())
