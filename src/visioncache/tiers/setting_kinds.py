"""How each kind of tier setting is read: text from the environment or a flag, JSON-typed values
from a mapping or Python. Every function takes (value, label, from_text), where ``label`` is the
setting as its source spells it (``VISIONCACHE_REDIS_TIMEOUT``, ``--vision-cache-redis-timeout``,
``ec_connector_extra_config.redis_timeout``), and raises `ConfigurationError` naming it, the value
and the accepted range. The ranges are what can work: a value past them would be accepted and then
make every tier operation fail (a socket timeout past what the OS takes, a size SQLite cannot
count, an expiry Redis refuses, a path with a NUL byte). Tier constructors check their arguments
with the same functions, so every source follows one rule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from visioncache.errors import ConfigurationError, describe_input
from visioncache.trees import parse_byte_size

__all__ = [
    "MAX_SECONDS",
    "MAX_TTL_SECONDS",
    "Converter",
    "directory",
    "flag",
    "redis_url",
    "seconds",
    "secrets_named_by",
    "size",
    "size_or_zero",
    "split_secrets",
    "text",
    "ttl",
]

# (value, the setting's name as its source spells it, whether the source gives text) -> value
Converter = Callable[[object, str, bool], Any]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
MAX_SECONDS = 86_400.0  # a day: no tier wait or retry interval is meant to be longer
MAX_TTL_SECONDS = 10 * 365 * 86_400  # ten years; Redis refuses an expiry past ~2.9e8 years


def _invalid(label: str, expected: str, value: object) -> ConfigurationError:
    return ConfigurationError(f"{label}: expected {expected}, got {describe_input(value)}")


def text(value: object, label: str, from_text: bool) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise _invalid(label, "a non-empty string", value)
    return value


def directory(value: object, label: str, from_text: bool) -> str:
    """A directory's path: it may not exist yet, but it may not be a file or hold a NUL byte."""
    path = text(value, label, from_text)
    if "\0" in path:
        raise _invalid(label, "a directory path without NUL bytes", path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigurationError(f"{label}: {path!r} exists and is not a directory")
    return path


def redis_url(value: object, label: str, from_text: bool) -> str:
    """A redis://, rediss:// or unix:// URL that redis-py can parse (when it is installed)."""
    url = text(value, label, from_text)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise _invalid(label, "a redis://, rediss:// or unix:// URL", url)
    try:
        from redis.connection import parse_url
    except ImportError:
        return url  # building the tier names the extra to install
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as error:
        raise ConfigurationError(f"{label}: malformed URL {url!r}: {error}") from None
    return url


def _number(value: object, label: str, from_text: bool, expected: str) -> float:
    original = value
    if from_text and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _invalid(label, expected, original) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(label, expected, original)
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise _invalid(label, expected, original) from None
    if not math.isfinite(number):
        raise _invalid(label, expected, original)
    return number


def seconds(value: object, label: str, from_text: bool) -> float:
    """A number of seconds, more than 0 and at most `MAX_SECONDS` (a day)."""
    expected = f"a number of seconds > 0 and <= {MAX_SECONDS:g}"
    number = _number(value, label, from_text, expected)
    if not 0 < number <= MAX_SECONDS:
        raise _invalid(label, expected, value)
    return number


def ttl(value: object, label: str, from_text: bool) -> int | None:
    """Whole seconds before an entry expires, at most `MAX_TTL_SECONDS`; 0 means never (None)."""
    expected = f"a whole number of seconds from 0 (never expire) to {MAX_TTL_SECONDS} (ten years)"
    number = _number(value, label, from_text, expected)
    if not 0 <= number <= MAX_TTL_SECONDS or number != int(number):
        raise _invalid(label, expected, value)
    return int(number) or None


def size(value: object, label: str, from_text: bool) -> int:
    """A byte size > 0: an int or a string such as ``"20GiB"``."""
    nbytes = size_or_zero(value, label, from_text)
    if not nbytes:
        raise _invalid(label, "a size > 0, e.g. 20GiB", value)
    return nbytes


def size_or_zero(value: object, label: str, from_text: bool) -> int:
    """A byte size >= 0: an int or a string such as ``"256MiB"``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _invalid(label, "an int or a size such as '2GiB'", value)
    nbytes = parse_byte_size(value, name=label)
    assert nbytes is not None  # only None parses to None
    return nbytes


def flag(value: object, label: str, from_text: bool) -> bool:
    """A bool; text also as 1/0, true/false, yes/no, on/off."""
    if from_text and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if not isinstance(value, bool):
        raise _invalid(label, "true or false (1/0, yes/no, on/off)" if from_text else "true or false", value)
    return value


def split_secrets(value: str) -> tuple[bytes, ...]:
    """Comma-separated secrets, in order (the first signs)."""
    return tuple(part.strip().encode() for part in value.split(",") if part.strip())


def secrets_named_by(variable: object, label: str, environ: Mapping[str, str] | None) -> tuple[bytes, ...]:
    """The secrets in the environment variable named ``variable`` (none when it is None)."""
    if variable is None:
        return ()
    name = text(variable, label, True)
    secrets = split_secrets((os.environ if environ is None else environ).get(name, ""))
    if not secrets:
        raise ConfigurationError(f"{label} names {name!r}, but that environment variable is unset or empty")
    return secrets
