"""What a purge removes from a shared tier: the entries of namespaces, of tenants, or of images.

A tier key is ``<tag>/<level>/<64 hex>`` (`visioncache.identity.keys`): the tag is a digest of the
namespace and the tenant salt, and each tag's namespace name is recorded under
``__namespaces__/<tag>`` (`namespaces`). A per-image key's 64 hex are the image's digest, keyed by
the salt when there is one, then keyed again by the tier's HMAC secret (`chain.tier_keys_under`).
None of it can be read back into an image, by design; so a purge recomputes keys from what it is
given and matches them against the keys the tier holds:

- **namespaces**: every tag recorded under one of them (or a namespace derived from one: an
  adapter's ``name+adapter/...``, a weight epoch's ``name@weights-epoch/...``), every tenant's;
- **tenants** (salts): every tag of a recorded namespace under one of those salts;
- **images** (digests): the per-image key of each digest, at every level held under the selected
  tags (every recorded namespace, the tenants given and the unsalted one by default), under every
  secret given and none.

Selections narrow each other: images of tenants of namespaces. Entries keyed by several images and
a prompt (the reference API's pixel and encoding levels) are found by namespace or tenant only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from visioncache.errors import ConfigurationError
from visioncache.identity.keys import KeyBuilder
from visioncache.tiers.chain import tier_keys_under
from visioncache.tiers.namespaces import NAMESPACE_PREFIX

__all__ = ["PurgePlan", "PurgeSelection", "plan_purge"]

_DERIVED = ("@", "+")  # what follows a namespace name in the namespaces derived from it


@dataclass(frozen=True)
class PurgeSelection:
    """What to remove. ``salts`` are tenant secrets; ``None`` in them is the unsalted namespace."""

    namespaces: tuple[str, ...] = ()
    salts: tuple[str | bytes | None, ...] = ()
    digests: tuple[bytes, ...] = ()
    secrets: tuple[bytes, ...] = ()  # HMAC secrets the tier's keys may be under

    def __post_init__(self) -> None:
        if not (self.namespaces or self.salts or self.digests):
            raise ConfigurationError("a purge needs a namespace, a tenant or an image to remove")


@dataclass
class PurgePlan:
    """The tier keys to delete, and how many per (namespace name, level) for the report."""

    keys: list[str] = field(default_factory=list)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)


def _matches(name: str | None, namespaces: Sequence[str]) -> bool:
    if not namespaces:
        return True
    return name is not None and any(
        name == wanted or any(name.startswith(wanted + mark) for mark in _DERIVED) for wanted in namespaces
    )


def plan_purge(stored: Iterable[str], names: dict[str, str | None], selection: PurgeSelection) -> PurgePlan:
    """The keys of ``stored`` (a tier's keys) that ``selection`` removes; ``names`` maps each
    recorded tag to its namespace name (None: unreadable record)."""
    by_tag: dict[str, list[str]] = defaultdict(list)
    for key in stored:
        if not key.startswith(NAMESPACE_PREFIX):
            by_tag[key.partition("/")[0]].append(key)
    named = {name for name in names.values() if name is not None and _matches(name, selection.namespaces)}
    named.update(selection.namespaces)
    tags: dict[str, tuple[str, KeyBuilder | None]] = {}  # tag -> (namespace name, its builder)
    if selection.salts or selection.digests:  # images without tenants: the unsalted namespace's
        for name in named:
            for salt in selection.salts or (None,):
                builder = KeyBuilder(name, salt)
                tags[builder.tag] = (name, builder)
    else:  # namespaces alone: every tenant's tags of them
        for tag, recorded in names.items():
            if recorded is not None and _matches(recorded, selection.namespaces):
                tags[tag] = (recorded, None)
    plan = PurgePlan()
    for tag, (name, tag_builder) in tags.items():
        held = by_tag.get(tag, [])
        if not selection.digests:
            for key in held:
                plan.keys.append(key)
                plan.counts[(name, key.split("/")[1])] += 1
            if held and NAMESPACE_PREFIX + tag not in plan.keys:
                plan.keys.append(NAMESPACE_PREFIX + tag)
            continue
        assert tag_builder is not None
        present = set(held)
        for level in sorted({key.split("/")[1] for key in held}):
            for digest in selection.digests:
                key = tag_builder.image_key(level, digest)
                for variant in dict.fromkeys([key, *tier_keys_under(key, selection.secrets)]):
                    if variant in present:
                        plan.keys.append(variant)
                        plan.counts[(name, level)] += 1
    return plan
