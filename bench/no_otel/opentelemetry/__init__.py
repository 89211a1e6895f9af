"""A stand-in that makes ``import opentelemetry`` fail, as when the ``otel`` extra is not
installed: ``bench/throughput.py --otel absent`` puts this folder first on the worker's
PYTHONPATH, so one environment measures the worker with and without the extra."""

from __future__ import annotations

raise ImportError("opentelemetry is hidden by bench/no_otel (throughput.py --otel absent)")
