"""Tenants and fleets stay apart in a shared tier: tier keys reveal no image digest, an unsigned
network tier warns, and fleets rotating secrets do not evict each other (docs/guarantees.md)."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.tier_values import (
    REPOSITORY,
    Encoder,
    all_correct,
    image,
    must_not_encode,
    preprocess,
    value_of,
)
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.identity.keys import DEFAULT_NAMESPACE, KeyBuilder
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier


# ---- tier keys reveal which images were processed ----------------------------------------
@pytest.mark.parametrize("tenancy", ["salt", "secret"])
def test_regression_tier_keys_reveal_which_images_were_processed(
    tenancy: str, redis_server: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """Tier keys held the plain image digest, so anyone who can list a shared tier's keys
    could test whether any tenant processed a known image. With a salt or an HMAC secret, the
    digest part is keyed: unlinkable across tenants and unguessable without the salt/secret."""
    known = image(700)
    digest = bytes.fromhex(compute_image_hash(known))

    def tenant(name: str) -> VisionEmbeddingCache:
        tiers = [DiskTier(tmp_path / "disk"), RedisTier(redis_server.url, key_prefix=redis_prefix)]
        if tenancy == "salt":
            return VisionEmbeddingCache(salt=name, tiers=tiers)
        return VisionEmbeddingCache(tiers=TierChain(tiers, secrets=[name.encode()]))

    for name in ("tenant-a", "tenant-b"):
        cache = tenant(name)
        cache.encode_images([known], Encoder())
        cache.preprocess_images([known], preprocess)
        cache.set_pixel_cache([known], "describe it", value_of(known), np.arange(4))
        cache.close()

    plain = KeyBuilder(DEFAULT_NAMESPACE)  # what an observer without the salt or secret can compute
    guessable = {plain.image_key(level, digest) for level in ("embedding", "pixel_only")}
    guessable.add(plain.key("pixel", [digest], "describe it"))
    for listed in (
        DiskTier(tmp_path / "disk").keys(),
        RedisTier(redis_server.url, key_prefix=redis_prefix).keys(),
    ):
        keys = [key for key in listed if not key.startswith("__namespaces__/")]
        assert len(keys) == 6  # two tenants x three levels, none shared
        assert not any(digest.hex() in key for key in keys), keys
        assert not guessable & set(keys)
        embedding_digests = {key.rsplit("/", 1)[1] for key in keys if "/embedding/" in key}
        assert len(embedding_digests) == 2  # even the digest parts differ between tenants


# ---- unsigned shared tiers trust every writer -------------------------------------------
def test_regression_unsigned_network_tier_warns_once_per_process(tmp_path: Path) -> None:
    """A shared network tier without an HMAC secret lets anyone who can write to it plant
    values, silently. Now an `UnsignedTierWarning`, once per process; none with a secret, none for
    a host-local disk tier."""
    script = textwrap.dedent(f"""
        import json, warnings
        warnings.simplefilter("always")
        from visioncache import VisionEmbeddingCache
        from visioncache.tiers.chain import TierChain
        from visioncache.tiers.disk import DiskTier
        from visioncache.tiers.redis import RedisTier

        url = "redis://127.0.0.1:1/0"  # never contacted: constructing opens nothing
        counts = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            TierChain([DiskTier({str(tmp_path)!r})])
            VisionEmbeddingCache(tiers=[DiskTier({str(tmp_path)!r})])
            counts["disk"] = len(caught)
            TierChain([RedisTier(url)], secrets=[b"s"])
            TierChain([DiskTier({str(tmp_path)!r}), RedisTier(url)], secrets=[b"new", b"old"])
            counts["signed"] = len(caught)
            TierChain([RedisTier(url)])
            VisionEmbeddingCache(tiers=[RedisTier(url)])
            TierChain([RedisTier(url, cluster=True)])
            counts["unsigned"] = len(caught)
            counts["categories"] = sorted({{warning.category.__name__ for warning in caught}})
        print(json.dumps(counts))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPOSITORY
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts == {"disk": 0, "signed": 0, "unsigned": 1, "categories": ["UnsignedTierWarning"]}


# ---- secret rotation ---------------------------------------------------------------------
def test_regression_rotating_fleets_share_a_server_without_evicting_each_other(
    redis_server: Any, redis_prefix: str
) -> None:
    """A reader holding another secret deleted (and overwrote) every signed entry it read,
    so two fleets mid-rotation evicted each other. Now the new fleet (``[new, old]``) reads the old
    fleet's entries, and neither fleet's reads remove the other's."""

    def host(*secrets: str) -> VisionEmbeddingCache:
        tier = RedisTier(redis_server.url, key_prefix=redis_prefix)
        return VisionEmbeddingCache(tiers=TierChain([tier], secrets=[item.encode() for item in secrets]))

    old_batch, new_batch = (
        [image(seed) for seed in range(800, 803)],
        [image(seed) for seed in range(803, 806)],
    )
    old_host = host("old")
    old_host.encode_images(old_batch, Encoder())
    old_host.close()
    new_host = host("new", "old")
    assert all_correct(new_host.encode_images(old_batch, must_not_encode), old_batch)  # accepted
    new_host.encode_images(new_batch, Encoder())  # signed with "new"
    new_host.close()

    old_again, encoder = host("old"), Encoder()
    assert all_correct(old_again.encode_images(new_batch, encoder), new_batch)
    assert encoder.encoded == 3  # the old fleet cannot verify "new" entries: it encodes them ...
    old_again.close()
    for fresh in (host("new", "old"), host("old")):  # ... and removed nothing of either fleet's
        assert all_correct(fresh.encode_images(old_batch, must_not_encode), old_batch)
    assert all_correct(host("new", "old").encode_images(new_batch, must_not_encode), new_batch)
    listed = list(RedisTier(redis_server.url, key_prefix=redis_prefix).keys())
    stored = [key for key in listed if "/embedding/" in key]
    assert len(stored) == 9  # old: 3 old + 3 new batch; new: 3 new batch; nothing deleted
