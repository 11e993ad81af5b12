"""The one way the tier commands (``stats``, ``purge``) name and open a disk or Redis tier."""

from __future__ import annotations

import argparse
import os

from visioncache.errors import ConfigurationError
from visioncache.tiers import Tier, TierSettings, defaults
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_name

__all__ = ["SCAN_TIMEOUT", "add_tier_arguments", "open_tier", "read_tier"]

SCAN_TIMEOUT = 5.0  # seconds per Redis operation while listing a tier


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """``--disk DIR`` or ``--redis URL`` (with ``--prefix`` and ``--cluster``)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--disk", metavar="DIR", help="directory of a disk tier")
    where.add_argument("--redis", metavar="URL", help="redis:// URL of a Redis/Valkey tier")
    parser.add_argument(
        "--prefix", default=defaults.REDIS_PREFIX, help=f"Redis key prefix (default: {defaults.REDIS_PREFIX})"
    )
    parser.add_argument(
        "--cluster", action="store_true", help="--redis URL names a node of a Redis Cluster: read every node"
    )


def open_tier(args: argparse.Namespace) -> tuple[Tier, str]:
    """The tier the arguments name, and a description of it; a Redis URL naming one node of a
    cluster without ``--cluster`` is refused (one node holds only some keys)."""
    if args.disk is not None:
        if not os.path.isdir(args.disk):
            raise ConfigurationError(f"--disk {args.disk!r} is not a directory")
        settings = TierSettings(disk_dir=args.disk)  # no disk_max_bytes: keep the writers' limit
        where = f"disk tier {args.disk}"
    else:
        cluster: bool = args.cluster
        # A scan may take longer than a request's lookup: a generous timeout per operation.
        settings = TierSettings(
            redis_url=args.redis, redis_prefix=args.prefix, redis_timeout=SCAN_TIMEOUT, redis_cluster=cluster
        )
        where = f"redis {'cluster ' if cluster else ''}tier {args.redis}, prefix {args.prefix!r}"
    (tier,) = settings.build_tiers()  # a missing extra fails here, naming its pip install
    if args.redis is not None and not args.cluster and _is_cluster_node(args.redis):
        tier.close()
        raise ConfigurationError(
            f"--redis {args.redis!r} is a node of a Redis Cluster: add --cluster to read every node"
        )
    return tier, where


def read_tier(args: argparse.Namespace) -> tuple[Tier, str, list[str], dict[str, str | None]]:
    """The open tier the arguments name (the caller closes it), its description, every key it
    holds and each recorded tag's namespace name (None: an unreadable record)."""
    tier, where = open_tier(args)
    try:
        keys = list(tier.keys())
        names = {}
        for key in keys:
            if key.startswith(NAMESPACE_PREFIX):
                record = tier.get(key)
                names[key[len(NAMESPACE_PREFIX) :]] = namespace_name(record) if record else None
    except Exception as error:  # an unreachable server or unreadable tier: a message, not a traceback
        tier.close()
        raise ConfigurationError(f"cannot read {where}: {error}") from None
    return tier, where, keys, names


def _is_cluster_node(url: str) -> bool:
    """Whether the server at ``url`` runs in cluster mode (then one node holds only some keys)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=SCAN_TIMEOUT, socket_connect_timeout=SCAN_TIMEOUT)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except Exception as error:
        raise ConfigurationError(f"cannot read redis tier {url}: {error}") from None
    finally:
        client.close()
