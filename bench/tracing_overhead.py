"""What the tracing facade costs one job when tracing is off, in nanoseconds (issue #17).

Times, in this process, the calls a job's hot path makes into ``tracing.py``
whatever the configuration -- the claim, run, outcome and publish spans, and
the log context -- against the same loop without them, and the
``parse_envelope`` of a message without trace headers against one with a
``traceparent``. Run once with opentelemetry importable and no provider
(``off``) and once with it hidden as if the ``otel`` extra were not installed
(``absent``: ``bench/no_otel`` first on the path), each in a child process:

    python bench/tracing_overhead.py [--rounds 7] [--loops 200000]

Prints per-job nanoseconds, median [min-max] over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def measure(rounds: int, loops: int) -> dict[str, list[float]]:
    """In this process: ns per job of the facade's calls and of the header check."""
    from coldbrew import tracing
    from coldbrew.model import JobFields, message_body, parse_envelope

    job = JobFields("j1", "noop", "default", "default", {}, 0, None, None, None)
    body = message_body("noop", {})
    plain: dict[str, object] = {"x-max-attempts": 3}
    traced = plain | {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    def facade() -> None:
        for _ in range(loops):
            with tracing.job_span("coldbrew claim", job, kind="consumer", destination="ns"):
                pass
            if tracing.active():
                raise AssertionError("tracing is on: this bench measures it off")
            with tracing.log_trace_id(job), tracing.job_span("coldbrew outcome", job, attempt=1):
                pass
            with tracing.job_span("coldbrew publish", job, kind="producer", destination="x"):
                pass

    def baseline() -> None:
        for _ in range(loops):
            pass

    def parse(headers: dict[str, object]) -> None:
        for _ in range(loops):
            parse_envelope(
                body,
                routing_key="default.default",
                message_id="j1",
                headers=headers,
                priority=None,
                max_body_bytes=1 << 20,
            )

    def timed(fn: object, *args: object) -> float:
        start = time.perf_counter_ns()
        fn(*args)  # type: ignore[operator]
        return (time.perf_counter_ns() - start) / loops

    out: dict[str, list[float]] = {"facade": [], "parse_plain": [], "parse_traceparent": []}
    for _ in range(rounds):
        out["facade"].append(timed(facade) - timed(baseline))
        out["parse_plain"].append(timed(parse, plain))
        out["parse_traceparent"].append(timed(parse, traced))
    out["otel_imported"] = [float("opentelemetry.trace" in sys.modules)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=200_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds, args.loops)))
        return 0
    for label, extra in (("absent", [str(HERE / "no_otel")]), ("off", [])):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*extra, str(REPO / "src"), str(REPO)]))
        command = [sys.executable, str(Path(__file__).resolve()), "--child"]
        command += ["--rounds", str(args.rounds), "--loops", str(args.loops)]
        found = json.loads(subprocess.run(command, env=env, capture_output=True, check=True).stdout)
        cells = []
        for name in ("facade", "parse_plain", "parse_traceparent"):
            values = found[name]
            cells.append(
                f"{name} {statistics.median(values):.0f} ns [{min(values):.0f}-{max(values):.0f}]"
            )
        imported = "opentelemetry imported" if found["otel_imported"][0] else "not imported"
        print(f"{label:6} ({imported}): " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
