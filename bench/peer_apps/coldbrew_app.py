"""coldbrew's side of the peer bench: ``bench.apps``'s no-op app, with its acks counted.

The same app ``bench/throughput.py`` runs; importing it through this module
also counts the worker's acks (see ``ackcount``) so coldbrew's drain ends
exactly as the peers' do, at the N-th ack.
"""

from __future__ import annotations

from bench.apps import app
from bench.peer_apps import ackcount

ackcount.install("aiormq")

__all__ = ["app"]
