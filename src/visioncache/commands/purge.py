"""``visioncache purge``: remove entries from a disk or Redis tier by namespace, tenant or image.

What is removed is decided by `visioncache.tiers.purge` (keys recomputed from what is given and
matched against the keys the tier holds, under every HMAC secret given): every entry of a
``--namespace``; every entry of a tenant (``--salt-env``: the variable holding its secret, a
serve-mlx tenant secret or a vLLM ``cache_salt``; secrets never go on a command line); or an
image's entries (``--image FILE``, ``--image -`` for bytes on stdin, ``--digest HEX``, or a serve-mlx
``--handle``, opened under the tenants given), within the tenants given (none: the unsalted
namespace). vLLM's connector keys an image by the inputs vLLM's processor makes of it: with
``--vllm-model DIR`` each image is processed as that model's vLLM server processes it (vLLM
installed). A running server still holds what it has in memory: its own purge route (serve-mlx's
``DELETE /v1/visioncache/images/{handle}``) or a restart clears that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from visioncache.cli import Subparsers
from visioncache.commands.tier_access import add_tier_arguments, read_tier
from visioncache.errors import ConfigurationError
from visioncache.identity import DIGEST_SIZE, ImageHasher
from visioncache.tiers.purge import PurgePlan, PurgeSelection, plan_purge
from visioncache.tiers.setting_kinds import split_secrets

__all__ = ["add_parser", "format_report", "run"]


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "purge", help="remove entries from a disk or Redis tier", description=__doc__.splitlines()[0]
    )
    add_tier_arguments(parser)
    parser.add_argument("--namespace", action="append", default=[], help="a namespace name (repeatable)")
    parser.add_argument(
        "--salt-env", action="append", default=[], metavar="VAR", help="variable holding a tenant secret"
    )
    parser.add_argument(
        "--hmac-secret-env", metavar="VAR", help="variable holding the tiers' HMAC secret(s), comma-separated"
    )
    parser.add_argument(
        "--image", action="append", default=[], metavar="FILE", help="an image file, - for stdin"
    )
    parser.add_argument(
        "--digest", action="append", default=[], metavar="HEX", help="an image's content digest"
    )
    parser.add_argument("--handle", action="append", default=[], help="a serve-mlx image handle")
    parser.add_argument("--vllm-model", metavar="DIR", help="key --image files as vLLM's connector does")
    parser.add_argument(
        "--mm-processor-kwargs", metavar="JSON", help="with --vllm-model: the requests' mm_processor_kwargs"
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would be removed, remove nothing")


def _variable(name: str, flag: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise ConfigurationError(f"{flag} names {name!r}, but that environment variable is unset or empty")
    return value


def _images(paths: Sequence[str]) -> list[bytes]:
    images = []
    for path in paths:
        try:
            if path == "-":
                images.append(sys.stdin.buffer.read())
            else:
                with open(path, "rb") as handle:
                    images.append(handle.read())
        except OSError as error:
            raise ConfigurationError(f"--image {path!r}: {error}") from None
    return images


def _digests(args: argparse.Namespace, salts: Sequence[str | None]) -> list[bytes]:
    digests = []
    for text in args.digest:
        try:
            digest = bytes.fromhex(text)
        except ValueError:
            digest = b""
        if len(digest) != DIGEST_SIZE:
            raise ConfigurationError(f"--digest {text!r}: expected {2 * DIGEST_SIZE} hex characters")
        digests.append(digest)
    images = _images(args.image)
    if args.vllm_model is not None:
        from visioncache.integrations.vllm.image_digests import encoder_input_digests

        kwargs = json.loads(args.mm_processor_kwargs) if args.mm_processor_kwargs else None
        digests += encoder_input_digests(args.vllm_model, images, mm_processor_kwargs=kwargs)
    else:
        hasher = ImageHasher()
        digests += [hasher.digest(image) for image in images]
    for handle in args.handle:
        digests.append(_open_handle(handle, salts))
    return digests


def _open_handle(handle: str, salts: Sequence[str | None]) -> bytes:
    from visioncache.integrations.handles import HandleCodec, HandleError

    for salt in salts:
        try:
            return HandleCodec(salt).open(handle)
        except HandleError:
            continue
    raise ConfigurationError(f"--handle {handle[:80]!r} opens under none of the tenants given (--salt-env)")


def run(args: argparse.Namespace) -> int:
    salts: list[str | None] = [_variable(name, "--salt-env") for name in args.salt_env]
    secrets = (
        split_secrets(_variable(args.hmac_secret_env, "--hmac-secret-env")) if args.hmac_secret_env else ()
    )
    digests = _digests(args, salts or [None])
    selection = PurgeSelection(
        namespaces=tuple(args.namespace), salts=tuple(salts), digests=tuple(digests), secrets=secrets
    )
    tier, where, keys, names = read_tier(args)
    try:
        plan = plan_purge(keys, names, selection)
        if not args.dry_run:
            for key in plan.keys:
                tier.delete(key)
    except Exception as error:
        raise ConfigurationError(f"cannot purge {where}: {error}") from None
    finally:
        tier.close()
    print(format_report(where, plan, dry_run=args.dry_run))
    return 0


def format_report(where: str, plan: PurgePlan, *, dry_run: bool = False) -> str:
    """What was removed: a total, then one line per namespace and level."""
    entries = sum(plan.counts.values())
    verb = "would remove" if dry_run else "removed"
    lines = [f"{where}: {verb} {entries} entries"]
    for (name, level), count in sorted(plan.counts.items()):
        lines.append(f"  {name}  {level}={count}")
    return "\n".join(lines)
