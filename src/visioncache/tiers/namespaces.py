"""Namespace records in shared tiers: ``__namespaces__/<tag>`` -> the readable namespace name.

Entry keys carry only a namespace's tag (a digest); a record per tag lets ``visioncache stats``
show which models' entries a tier holds. A chain writes each of its records once per process,
with its first save.
"""

from __future__ import annotations

import json

__all__ = ["NAMESPACE_PREFIX", "namespace_name", "namespace_record"]

NAMESPACE_PREFIX = "__namespaces__/"


def namespace_record(tag: str, name: str) -> bytes:
    """The record stored under ``NAMESPACE_PREFIX + tag``."""
    return json.dumps({"tag": tag, "name": name}).encode()


def namespace_name(record: bytes) -> str | None:
    """The namespace name in a record, or None if it is unreadable."""
    try:
        name = json.loads(record).get("name")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None
