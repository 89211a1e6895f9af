"""The pool's own exceptions, apart from the job outcomes in ``coldbrew.errors``.

Why a module of their own: the parent side raises them (``PoolClosed``) and
builds them from a child's failure frame (``RemoteJobError``), and callers
outside the package catch them through ``coldbrew.procpool``; keeping them
here lets every module of the package import them without a cycle.
"""

from __future__ import annotations

from coldbrew.errors import ColdbrewError

__all__ = ["PoolClosed", "RemoteJobError"]


class PoolClosed(ColdbrewError):
    """The process pool is not started yet, or is closed (or closing)."""


class RemoteJobError(ColdbrewError):
    """A job in the pool raised an exception other than ``Permanent``/``Retry``.

    ``kind`` is the exception's ``module.QualName`` (or ``UnpicklableResult``),
    ``traceback_text`` the child's formatted traceback.
    """

    def __init__(self, kind: str, message: str, traceback_text: str = "") -> None:
        super().__init__(kind, message, traceback_text)
        self.kind = kind
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"
