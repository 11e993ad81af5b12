"""The connector's configuration: every mistake is a clear error before anything starts."""

from __future__ import annotations

import pytest

from tests.integrations.vllm_ec.conftest import EngineRunner, ec_config
from visioncache.errors import ConfigurationError
from visioncache.integrations.vllm.config import ConnectorConfig


def test_a_full_configuration_parses() -> None:
    config = ConnectorConfig.from_extra_config(
        {
            "disk_dir": "/dev/shm/vc",
            "disk_max_bytes": "2GiB",
            "redis_url": "redis://cache:6379/0",
            "redis_cluster": True,
            "redis_timeout": 0.1,
            "redis_ttl_seconds": 3600,
            "retry_interval": 2,
            "hmac_secret_env": "VC_SECRETS",
            "namespace": "ops/qwen2-vl@3",
            "max_pending_write_bytes": "64MiB",
            "ignore_cache_salt": True,
        },
        environ={"VC_SECRETS": "new-secret, old-secret"},
    )
    tiers = config.tiers  # visioncache.tiers.TierSettings: the same settings as VISIONCACHE_*
    assert tiers.disk_max_bytes == 2 * 2**30
    assert tiers.secrets == (b"new-secret", b"old-secret")  # the first signs, both verify
    assert tiers.max_pending_write_bytes == 64 * 2**20
    assert tiers.redis_cluster and tiers.retry_interval == 2.0 and tiers.redis_ttl == 3600
    assert config.namespace == "ops/qwen2-vl@3"
    assert config.ignore_cache_salt  # one shared, public namespace whatever a request's cache_salt
    assert not ConnectorConfig.from_extra_config({"disk_dir": "/dev/shm/vc"}).ignore_cache_salt


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "no tier configured"),
        ({"disk_dir": "/nonexistent/vc", "disk_dri": "/tmp/y"}, "unknown key(s) ['disk_dri']"),
        ({"disk_dir": "/nonexistent/vc", "hmac_secret": "s3cret"}, "environment variable"),
        ({"disk_dir": "/nonexistent/vc", "hmac_secret_env": "VC_UNSET"}, "'VC_UNSET'"),
        ({"redis_url": "cache:6379"}, "redis://"),
        ({"disk_dir": "/nonexistent/vc", "disk_max_bytes": "2 parsecs"}, "disk_max_bytes"),
        ({"disk_dir": "/nonexistent/vc", "redis_timeout": 0}, "redis_timeout"),
        ({"disk_dir": "/nonexistent/vc", "redis_cluster": "yes"}, "redis_cluster"),
        ({"disk_dir": ""}, "disk_dir"),
        ({"disk_dir": "/nonexistent/vc", "trust_client_uuids": True}, "keyed by the encoder's inputs"),
        ({"disk_dir": "/nonexistent/vc", "ignore_cache_salt": "yes"}, "ignore_cache_salt"),
    ],
)
def test_configuration_mistakes_are_named(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match="ec_connector_extra_config") as error:
        ConnectorConfig.from_extra_config(extra, environ={})
    assert message in str(error.value)


def test_a_configuration_error_fails_vllm_start_up_with_the_message(run_engine: EngineRunner) -> None:
    with pytest.raises(AssertionError) as failure:
        run_engine("main", ec=ec_config(disk_dir="/tmp/unused", redis_ulr="redis://127.0.0.1:1/0"))
    assert "ConfigurationError" in str(failure.value)
    assert "unknown key(s) ['redis_ulr']" in str(failure.value)
