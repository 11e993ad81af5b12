"""A blob planted in a shared tier costs one miss and is gone, whatever its bytes.

Defect pinned: a stored entry whose JSON header was 200 KB of nested ``[`` made loading raise
`RecursionError` — the header was parsed before the digest or HMAC was checked — so every request
for that image failed, and the blob was never removed. Anyone who can write to the Redis tier
could do it, with a secret configured or not. Now a blob is verified before anything in it is
parsed, and what verifies but is still malformed (an unsigned tier's blake3 digest is anyone's to
make) is a corrupt entry: deleted, and missed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import encode_image, random_image
from tests.support.blobs import forge, forged_tree_text, nested_header_file
from tests.tiers.conftest import REDIS_SERVER, RedisProcess
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.errors import CorruptEntryError
from visioncache.tiers.base import Tier
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.serialization import loads

SECRET = b"the fleet's secret"
POISONS = {
    # the old layout: a safetensors file whose header nests 200 KB deep
    "nested header": nested_header_file(),
    # the current layout with a valid unkeyed digest: verifies unsigned, still malformed inside
    "nested header, valid digest": forge(nested_header_file()),
    # a well-formed file whose skeleton nests 200 KB deep
    "nested skeleton, valid digest": forged_tree_text("[" * 200_000),
}


def image(seed: int) -> bytes:
    return encode_image(random_image(seed, (8, 8)))


def value_of(item: bytes) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(compute_image_hash(item)), np.uint8).astype(np.float32)


class Encoder:
    def __init__(self) -> None:
        self.encoded = 0

    def __call__(self, images: list[Any]) -> list[np.ndarray]:
        self.encoded += len(images)
        return [value_of(item) for item in images]


@pytest.fixture(params=["disk", "redis"])
def tier_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "disk":
        return lambda: DiskTier(tmp_path / "disk")
    if REDIS_SERVER is None:
        pytest.skip("needs redis-server")
    pytest.importorskip("redis", reason="needs redis-py: pip install 'visioncache[redis]'")
    from visioncache.tiers.redis import RedisTier

    server: RedisProcess = request.getfixturevalue("redis_server")
    prefix: str = request.getfixturevalue("redis_prefix")
    return lambda: RedisTier(server.url, key_prefix=prefix, socket_timeout=30.0)


def cache_over(tier: Tier, secret: bytes | None) -> VisionEmbeddingCache:
    secrets = [secret] if secret is not None else []
    return VisionEmbeddingCache(tiers=TierChain([tier], secrets=secrets, max_pending_write_bytes=0))


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_every_poison_is_a_corrupt_entry_to_the_loader(poison: str) -> None:
    for secret in (None, SECRET):
        with pytest.raises(CorruptEntryError):
            loads(POISONS[poison], secret=secret, context="key")


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("poison", sorted(POISONS))
def test_regression_a_blob_with_a_deeply_nested_header_takes_its_image_down(
    tier_factory: Any, poison: str, signed: bool
) -> None:
    secret = SECRET if signed else None
    tier = tier_factory()
    cache = cache_over(tier, secret)
    planted, encoder = image(7), Encoder()
    assert cache.tiers is not None
    tier_key = cache.tiers.tier_keys(str(cache.key("embedding", [planted])))[0]
    tier.put(tier_key, POISONS[poison])

    values = cache.encode_images([planted], encoder)  # the request is served: one encode
    assert encoder.encoded == 1 and np.array_equal(values[0], value_of(planted))
    counts = cache.tiers.stats().tiers[0]
    assert counts.errors == 0  # one key's problem, not the tier's: the breaker stays closed
    assert counts.corrupt + counts.unverified == 1
    # The poison is gone: deleted (corrupt) or overwritten by the value just encoded.
    assert tier.get(tier_key) != POISONS[poison]
    again = Encoder()
    fresh = cache_over(tier_factory(), secret)
    assert np.array_equal(fresh.encode_images([planted], again)[0], value_of(planted))
    assert again.encoded == 0  # the next process reads the good value
