"""Optional dependencies: one way to fail when an extra is missing.

Importing ``visioncache`` needs only its core dependencies. Code that needs an optional package
imports it inside `requires`, so a missing package fails the same way everywhere: a
`MissingExtraError` (an `ImportError`, and a `VisionCacheError`, so the ``visioncache`` commands
print it without a traceback) naming the ``pip install 'visioncache[extra]'`` that fixes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from visioncache.errors import MissingExtraError

__all__ = ["EXTRAS", "missing_extra", "requires"]

# The extras of pyproject.toml a user installs (`dev` and `vllm-mlx-deps` are the project's own).
EXTRAS = ("handles", "hf", "mlx", "metrics", "redis", "vllm-mlx")


def missing_extra(extra: str, needed_by: str, module: str | None, detail: str = "") -> MissingExtraError:
    """The error for ``needed_by`` missing ``module``, which ``pip install 'visioncache[extra]'`` brings."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras: {EXTRAS}")
    message = f"{needed_by} needs {module or 'a package'}: pip install 'visioncache[{extra}]'"
    return MissingExtraError(message + (f" ({detail})" if detail else ""), name=module)


@contextmanager
def requires(extra: str, needed_by: str) -> Iterator[None]:
    """Imports inside this block that fail raise `MissingExtraError` for ``extra``.

    ``needed_by`` says what needs it (``"the Redis tier"``), for the message.
    """
    missing_extra(extra, needed_by, None)  # an unknown extra fails here, not when a package is missing
    try:
        yield
    except MissingExtraError:
        raise
    except ImportError as error:
        raise missing_extra(extra, needed_by, error.name, str(error)) from error
