"""What visioncache needs from the interpreter: the GIL.

Why: the hit path takes no lock. A hit reads two dicts and appends the key to a list of recent
hits (`visioncache.store.store`), and the path memo reads and reorders its `OrderedDict`; each is
one C operation, atomic because the GIL is held across it. Free-threaded CPython (3.13t, 3.14t)
runs those operations concurrently unless the GIL is switched back on (``PYTHON_GIL=1`` or
``-X gil=1``), and visioncache has not been proven there, so a store or a path memo refuses to be
built on it instead of racing.
"""

from __future__ import annotations

import sys

from visioncache.errors import UnsupportedRuntimeError

__all__ = ["gil_enabled", "require_gil"]


def gil_enabled() -> bool:
    """Whether this interpreter runs with the GIL (always True before Python 3.13)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def require_gil(what: str) -> None:
    """Raise `UnsupportedRuntimeError` on free-threaded CPython with the GIL disabled."""
    if not gil_enabled():
        raise UnsupportedRuntimeError(
            f"{what} needs the GIL: this is free-threaded CPython with the GIL disabled, which "
            "visioncache does not support (its lock-free hit path relies on the GIL). Run with "
            "PYTHON_GIL=1 or `python -X gil=1`."
        )
