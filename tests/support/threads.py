"""Run test threads with the interpreter switching threads as often as it can."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable


def run_threads(target: Callable[[int], object], count: int) -> None:
    """``target(0)`` ... ``target(count - 1)`` on ``count`` threads at ``sys.setswitchinterval(1e-6)``
    (a switch at almost every bytecode), joined; the interval is restored whatever happens."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
