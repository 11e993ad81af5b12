"""``visioncache stats``: what a disk or Redis tier holds: entries, bytes and namespaces.

Keys are ``<namespace tag>/<level>/<digest>``; entries are counted per tag and level, and each tag
is named from the ``__namespaces__/<tag>`` record the cache writes (``?`` when it is missing).
Reading is side-effect free: it changes neither the tier's size limit nor its LRU order.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter, defaultdict

from visioncache.cli import Subparsers
from visioncache.errors import ConfigurationError
from visioncache.tiers import TierSettings, defaults
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_name

__all__ = ["add_parser", "run"]

_SCAN_TIMEOUT = 5.0  # seconds per Redis operation while listing a tier


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "stats", help="summarise a disk or Redis tier", description=__doc__.splitlines()[0]
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--disk", metavar="DIR", help="directory of a disk tier")
    where.add_argument("--redis", metavar="URL", help="redis:// URL of a Redis/Valkey tier")
    parser.add_argument(
        "--prefix", default=defaults.REDIS_PREFIX, help=f"Redis key prefix (default: {defaults.REDIS_PREFIX})"
    )
    parser.add_argument(
        "--cluster", action="store_true", help="--redis URL names a node of a Redis Cluster: read every node"
    )


def run(args: argparse.Namespace) -> int:
    if args.disk is not None:
        if not os.path.isdir(args.disk):
            raise ConfigurationError(f"--disk {args.disk!r} is not a directory")
        settings = TierSettings(disk_dir=args.disk)  # no disk_max_bytes: keep the writers' limit
        where = f"disk tier {args.disk}"
    else:
        cluster: bool = args.cluster
        # A scan may take longer than a request's lookup: a generous timeout per operation.
        settings = TierSettings(
            redis_url=args.redis, redis_prefix=args.prefix, redis_timeout=_SCAN_TIMEOUT, redis_cluster=cluster
        )
        where = f"redis {'cluster ' if cluster else ''}tier {args.redis}, prefix {args.prefix!r}"
    (tier,) = settings.build_tiers()
    try:
        if args.redis is not None and not args.cluster and _is_cluster_node(args.redis):
            raise ConfigurationError(
                f"--redis {args.redis!r} is a node of a Redis Cluster: add --cluster to read every node"
            )
        keys = list(tier.keys())
        entry_keys = [key for key in keys if not key.startswith(NAMESPACE_PREFIX)]
        nbytes = tier.stored_bytes(entry_keys)
        names = {}
        for key in keys:
            if key.startswith(NAMESPACE_PREFIX):
                record = tier.get(key)
                names[key[len(NAMESPACE_PREFIX) :]] = namespace_name(record) if record else None
    except ConfigurationError:
        raise
    except Exception as error:  # an unreachable server or unreadable tier: a message, not a traceback
        raise ConfigurationError(f"cannot read {where}: {error}") from None
    finally:
        tier.close()
    print(format_summary(where, entry_keys, nbytes, names))
    return 0


def _is_cluster_node(url: str) -> bool:
    """Whether the server at ``url`` runs in cluster mode (then one node holds only some keys)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=_SCAN_TIMEOUT, socket_connect_timeout=_SCAN_TIMEOUT)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    finally:
        client.close()


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
