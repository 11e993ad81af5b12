"""``visioncache stats``: what a disk or Redis tier holds: entries, bytes and namespaces.

Keys are ``<namespace tag>/<level>/<digest>``; entries are counted per tag and level, and each tag
is named from the ``__namespaces__/<tag>`` record the cache writes (``?`` when it is missing).
Reading is side-effect free: it changes neither the tier's size limit nor its LRU order.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from visioncache.cli import Subparsers
from visioncache.commands.tier_access import add_tier_arguments, read_tier
from visioncache.errors import ConfigurationError
from visioncache.tiers.namespaces import NAMESPACE_PREFIX

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "stats", help="summarise a disk or Redis tier", description=__doc__.splitlines()[0]
    )
    add_tier_arguments(parser)


def run(args: argparse.Namespace) -> int:
    tier, where, keys, names = read_tier(args)
    try:
        entry_keys = [key for key in keys if not key.startswith(NAMESPACE_PREFIX)]
        nbytes = tier.stored_bytes(entry_keys)
    except Exception as error:
        raise ConfigurationError(f"cannot read {where}: {error}") from None
    finally:
        tier.close()
    print(format_summary(where, entry_keys, nbytes, names))
    return 0


def format_summary(where: str, keys: list[str], nbytes: int, names: dict[str, str | None]) -> str:
    """The report: totals, then one line per namespace tag with its entries per level."""
    per_tag: dict[str, Counter[str]] = defaultdict(Counter)
    for key in keys:
        tag, _, rest = key.partition("/")
        per_tag[tag][rest.partition("/")[0] or "?"] += 1
    tags = sorted(set(per_tag) | set(names))
    lines = [
        f"{where}: {len(keys)} entries, {nbytes} bytes ({nbytes / 2**20:.1f} MiB)",
        f"namespaces: {len(tags)}",
    ]
    for tag in tags:
        levels = per_tag.get(tag, Counter())
        detail = ", ".join(f"{level}={count}" for level, count in sorted(levels.items()))
        lines.append(f"  {tag}  {names.get(tag) or '?'}  {levels.total()} entries  {detail}")
    return "\n".join(lines)
