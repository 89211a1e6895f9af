"""``python -m coldbrew`` is the ``coldbrew`` command."""

from __future__ import annotations

from coldbrew.cli import main

raise SystemExit(main())
