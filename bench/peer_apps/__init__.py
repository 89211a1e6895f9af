"""The apps that ``bench/peers.py`` and ``bench/latency.py`` run: one no-op task per framework.

Each module reads its broker URL and queue names from ``CBBENCH_*`` variables
when it is imported, because each framework's worker CLI imports the module
by name and passes no arguments to it.
"""
