"""`TierSettings`, the one owner of tier settings: the environment, a mapping (vLLM's
``ec_connector_extra_config``) and the ``--vision-cache-*`` flags name each setting the same way,
share its default and its validation, and build the same chain."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import fields
from pathlib import Path

import pytest

from tests.support.optional import needs_redis, optional
from visioncache.errors import ConfigurationError
from visioncache.integrations.vllm.config import ConnectorConfig
from visioncache.tiers import TierSettings, UnsignedTierWarning, chain
from visioncache.tiers.breaker import CircuitBreaker
from visioncache.tiers.disk import DiskTier

# Every setting, as Python values and as text (what the environment and flags give).
SETTINGS: dict[str, tuple[object, str]] = {
    "disk_dir": ("/nonexistent/visioncache-disk", "/nonexistent/visioncache-disk"),
    "disk_max_bytes": (3 * 2**20, "3MiB"),
    "disk_timeout": (0.5, "0.5"),
    "redis_url": ("redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0"),
    "redis_prefix": ("vc-test:", "vc-test:"),
    "redis_ttl": (60, "60"),
    "redis_timeout": (0.1, "0.1"),
    "redis_cluster": (True, "1"),
    "redis_max_bytes": (2**20, "1MiB"),
    "retry_interval": (2.0, "2"),
    "max_pending_write_bytes": (0, "0"),
}
SECRETS = {"VC_SECRETS": "new, old"}


def parse_flags(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    TierSettings.add_arguments(parser)
    return parser.parse_args(list(flags))


def flag_list(values: dict[str, str]) -> list[str]:
    flags: list[str] = []
    for name, text in values.items():
        flag = "--vision-cache-" + name.replace("_", "-")
        flags += [flag] if name == "redis_cluster" else [flag, text]
    return flags


def test_every_setting_has_one_name_in_all_three_sources() -> None:
    names = {item.name for item in fields(TierSettings)} - {"secrets", "secret_setting"}
    assert names == set(SETTINGS)  # a new setting must be added here, and so in every source
    python = TierSettings(**{name: value for name, (value, _) in SETTINGS.items()}, secrets=(b"new", b"old"))
    text = {name: text for name, (_, text) in SETTINGS.items()}
    environment = {"VISIONCACHE_" + name.upper(): value for name, value in text.items()}
    secrets = {"VISIONCACHE_HMAC_SECRET": "new", "VISIONCACHE_HMAC_PREVIOUS_SECRETS": "old"}
    from_env = TierSettings.from_env({**environment, **secrets})
    mapping = {name: value for name, (value, _) in SETTINGS.items()}
    from_mapping = TierSettings.from_mapping({**mapping, "hmac_secret_env": "VC_SECRETS"}, environ=SECRETS)
    flags = [*flag_list(text), "--vision-cache-hmac-secret-env", "VC_SECRETS"]
    from_flags = TierSettings.from_args(parse_flags(*flags), environ=SECRETS)
    assert from_env == from_mapping == from_flags == python


def test_the_defaults_are_the_same_from_every_source() -> None:
    default = TierSettings()
    assert TierSettings.from_env({}) == TierSettings.from_mapping({}) == default
    assert TierSettings.from_args(parse_flags()) == default
    assert not default.configured and default.build_chain() is None
    assert (default.redis_prefix, default.redis_timeout, default.disk_timeout) == ("visioncache:", 0.25, 1.0)
    assert (default.retry_interval, default.max_pending_write_bytes) == (5.0, 256 * 2**20)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("disk_max_bytes", "2 parsecs"),
        ("disk_max_bytes", "0"),
        ("disk_timeout", "0"),
        ("redis_url", "cache:6379"),
        pytest.param("redis_url", "redis://host:notaport/0", marks=needs_redis),
        ("redis_ttl", "soon"),
        ("redis_ttl", "1.5"),
        ("redis_timeout", "nan"),
        ("redis_timeout", "-1"),
        ("redis_cluster", "maybe"),
        ("retry_interval", "inf"),
        ("max_pending_write_bytes", "lots"),
    ],
)
def test_a_bad_value_is_refused_by_every_source_naming_the_setting_as_it_spells_it(
    name: str, bad: str
) -> None:
    variable = "VISIONCACHE_" + name.upper()
    with pytest.raises(ConfigurationError, match=variable):
        TierSettings.from_env({variable: bad})
    key = "ec_connector_extra_config." + name
    with pytest.raises(ConfigurationError, match=key):
        TierSettings.from_mapping({name: bad}, context="ec_connector_extra_config")
    if name != "redis_cluster":  # a flag without a value: nothing to get wrong
        flag = "--vision-cache-" + name.replace("_", "-")
        with pytest.raises(ConfigurationError, match=flag):
            TierSettings.from_args(parse_flags(flag, bad))


def test_a_mapping_takes_json_types_not_text() -> None:
    for key, value in [("redis_cluster", "yes"), ("redis_timeout", "0.1"), ("disk_dir", "")]:
        with pytest.raises(ConfigurationError, match=key):
            TierSettings.from_mapping({key: value})
    assert TierSettings.from_mapping({"disk_max_bytes": "2GiB"}).disk_max_bytes == 2 * 2**30
    assert TierSettings(disk_max_bytes="2GiB").disk_max_bytes == 2 * 2**30  # type: ignore[arg-type]
    assert TierSettings.from_mapping({"redis_ttl": 0}).redis_ttl is None  # 0: never expire


def test_a_disk_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    with pytest.raises(ConfigurationError, match=r"VISIONCACHE_DISK_DIR: .* is not a directory"):
        TierSettings.from_env({"VISIONCACHE_DISK_DIR": str(path)})
    with pytest.raises(ConfigurationError, match="--vision-cache-disk-dir"):
        TierSettings.from_args(parse_flags("--vision-cache-disk-dir", str(path)))


def test_older_names_are_still_read_and_cannot_contradict_the_current_one() -> None:
    assert TierSettings.from_env({"VISIONCACHE_REDIS_RETRY_INTERVAL": "3"}).retry_interval == 3.0
    assert TierSettings.from_mapping({"redis_ttl_seconds": 3600}).redis_ttl == 3600
    with pytest.raises(ConfigurationError, match="keep 'redis_ttl'"):
        TierSettings.from_mapping({"redis_ttl_seconds": 3600, "redis_ttl": 60})


def test_secrets_come_from_the_environment_only() -> None:
    rotated = TierSettings.from_env(
        {"VISIONCACHE_HMAC_SECRET": "s3cret", "VISIONCACHE_HMAC_PREVIOUS_SECRETS": "older, oldest"}
    )
    assert rotated.secrets == (b"s3cret", b"older", b"oldest")  # the first signs, all verify
    assert "s3cret" not in repr(rotated)
    with pytest.raises(ConfigurationError, match="HMAC_PREVIOUS_SECRETS is set without"):
        TierSettings.from_env({"VISIONCACHE_HMAC_PREVIOUS_SECRETS": "j"})
    with pytest.raises(ConfigurationError, match="environment variable"):
        TierSettings.from_mapping({"hmac_secret": "s3cret"})
    with pytest.raises(ConfigurationError, match=r"'VC_UNSET'.* unset or empty"):
        TierSettings.from_mapping({"hmac_secret_env": "VC_UNSET"}, environ={})
    with pytest.raises(ConfigurationError, match="--vision-cache-hmac-secret-env"):
        TierSettings.from_args(parse_flags("--vision-cache-hmac-secret", "s3cret"))
    with pytest.raises(ConfigurationError, match="'VC_UNSET'"):
        TierSettings.from_args(parse_flags("--vision-cache-hmac-secret-env", "VC_UNSET"), environ={})


def test_an_unknown_key_is_an_error_unless_the_caller_owns_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['disk_dri'\]"):
        TierSettings.from_mapping({"disk_dri": str(tmp_path)})
    owned = TierSettings.from_mapping(
        {"disk_dir": str(tmp_path), "namespace": "n"}, other_keys=("namespace",)
    )
    assert owned == TierSettings(disk_dir=str(tmp_path))


def test_tiers_from_env_excludes_tier_flags(tmp_path: Path) -> None:
    environ = {"VISIONCACHE_DISK_DIR": str(tmp_path), "VISIONCACHE_HMAC_SECRET": "k"}
    settings = TierSettings.from_args(parse_flags("--vision-cache-tiers-from-env"), environ=environ)
    assert settings == TierSettings(disk_dir=str(tmp_path), secrets=(b"k",))
    with pytest.raises(ConfigurationError, match=r"not both.*--vision-cache-redis-url"):
        TierSettings.from_args(
            parse_flags("--vision-cache-tiers-from-env", "--vision-cache-redis-url", "redis://h/0"),
            environ=environ,
        )


@needs_redis
def test_the_chain_gets_every_setting(tmp_path: Path) -> None:
    text = {name: text for name, (_, text) in SETTINGS.items()} | {"disk_dir": str(tmp_path)}
    text.pop("redis_cluster")  # a cluster takes no byte budget (test_redis_budget); its flag: below
    flags = [*flag_list(text), "--vision-cache-hmac-secret-env", "VC_SECRETS"]
    built = TierSettings.from_args(parse_flags(*flags), environ=SECRETS).build_chain()
    assert built is not None
    assert len(built.tier_keys("tag/level/" + "ab" * 32)) == 2  # signs with "new", still reads "old"
    from visioncache.tiers.redis import RedisTier

    disk, remote = built.tiers
    assert isinstance(disk, DiskTier) and isinstance(remote, RedisTier)
    assert (disk.directory, disk.max_bytes, disk.timeout) == (str(tmp_path), 3 * 2**20, 0.5)
    assert (remote.key_prefix, remote.ttl_seconds, remote.max_bytes) == ("vc-test:", 60, 2**20)
    assert remote._options["socket_timeout"] == 0.1
    assert [guarded.breaker.retry_interval for guarded in built._guarded] == [2.0, 2.0]
    assert built._writer is None  # max_pending_write_bytes 0: writes on the caller's thread
    built.close()


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: TierSettings.from_env({"VISIONCACHE_REDIS_URL": "redis://h/0"}), "VISIONCACHE_HMAC_SECRET"),
        (
            lambda: ConnectorConfig.from_extra_config({"redis_url": "redis://h/0"}).tiers,
            "ec_connector_extra_config.hmac_secret_env",
        ),
        (
            lambda: TierSettings.from_args(parse_flags("--vision-cache-redis-url", "redis://h/0")),
            "--vision-cache-hmac-secret-env",
        ),
    ],
    ids=["environment", "vllm", "serve-mlx"],
)
@needs_redis
def test_regression_unsigned_tier_warning_names_the_integrations_secret_setting(
    build: object, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning told every user to use "your integration's secret setting"."""
    monkeypatch.setattr(chain, "_warned_unsigned", False)
    settings = build()  # type: ignore[operator]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = settings.build_chain()
    assert [str(item.message) for item in caught if item.category is UnsignedTierWarning]
    assert named in str(caught[0].message)
    built.close()


def test_docs_list_every_setting_with_its_three_spellings() -> None:
    page = (Path(__file__).parents[2] / "docs" / "tiers.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for name in SETTINGS:
        assert f"`VISIONCACHE_{name.upper()}`" in rows[name]
        assert f"`--vision-cache-{name.replace('_', '-')}`" in rows[name]


def test_regression_a_comma_in_the_signing_secret_split_it_into_two_weaker_secrets() -> None:
    """VISIONCACHE_HMAC_SECRET is one secret: splitting it on commas signed with a part of it."""
    settings = TierSettings.from_env({"VISIONCACHE_HMAC_SECRET": "correct,horse battery"})
    assert settings.secrets == (b"correct,horse battery",)


# ---- settings that can never work ----------------------------------------------------------------
# Each was accepted (or raised an untyped OverflowError), after which every tier operation failed
# and was only counted: sizes SQLite cannot count, timeouts and expiries no OS or Redis takes, a
# path with a NUL byte. One rule for every source: a ConfigurationError at construction naming the
# setting, the value and the accepted range.
ABSURD = {
    "disk_max_bytes": ("9" * 400, "0 to 8 EiB"),
    "max_pending_write_bytes": ("9" * 400, "0 to 8 EiB"),
    "redis_timeout": ("1e308", "<= 86400"),
    "disk_timeout": ("1e308", "<= 86400"),
    "retry_interval": ("99999999999999999999", "<= 86400"),
    "redis_ttl": ("99999999999999999999", "to 315360000"),
    "disk_dir": ("/tmp/visioncache\0disk", "without NUL"),
}
ABSURD_SIZES = ["100000000TiB", str(2**63)]


def every_source(setting: str, value: str) -> list[tuple[str, object]]:
    """(the source's spelling of the setting, a call reading ``value`` from that source)."""
    base = {"disk_dir": "/tmp/visioncache-absurd", "redis_url": "redis://127.0.0.1:1/0"}
    env = {f"VISIONCACHE_{key.upper()}": item for key, item in {**base, setting: value}.items()}
    parser = argparse.ArgumentParser()
    TierSettings.add_arguments(parser)
    flags = [
        item
        for key, given in {**base, setting: value}.items()
        for item in (f"--vision-cache-{key.replace('_', '-')}", given)
    ]
    return [
        (f"VISIONCACHE_{setting.upper()}", lambda: TierSettings.from_env(env)),
        (f"extra.{setting}", lambda: TierSettings.from_mapping({**base, setting: value}, context="extra")),
        (
            f"--vision-cache-{setting.replace('_', '-')}",
            lambda: TierSettings.from_args(parser.parse_args(flags)),
        ),
    ]


@pytest.mark.parametrize("setting", sorted(ABSURD))
def test_regression_settings_that_can_never_work_are_accepted(setting: str) -> None:
    value, accepted = ABSURD[setting]
    for label, read in every_source(setting, value):
        with pytest.raises(ConfigurationError) as raised:
            read()  # type: ignore[operator]
        message = str(raised.value)
        assert label in message and accepted in message, message


@pytest.mark.parametrize("size", ABSURD_SIZES)
def test_regression_a_disk_budget_beyond_what_sqlite_counts_is_accepted(size: str) -> None:
    for label, read in every_source("disk_max_bytes", size):
        with pytest.raises(ConfigurationError, match="0 to 8 EiB"):
            read()  # type: ignore[operator]
        assert label


def test_regression_a_blank_hmac_secret_in_the_environment_writes_unsigned_entries() -> None:
    """``VISIONCACHE_HMAC_SECRET="   "`` was read as "no secret" (every entry written unsigned),
    while the same blank value named by ``hmac_secret_env`` was refused: both are refused now."""
    blank = {"VISIONCACHE_DISK_DIR": "/tmp/visioncache-absurd", "VISIONCACHE_HMAC_SECRET": "   "}
    with pytest.raises(ConfigurationError, match="VISIONCACHE_HMAC_SECRET is set but blank"):
        TierSettings.from_env(blank)
    with pytest.raises(ConfigurationError, match="unset or empty"):
        TierSettings.from_mapping(
            {"disk_dir": "/tmp/x", "hmac_secret_env": "SECRET"}, environ={"SECRET": "  "}
        )


def test_tier_constructors_follow_the_same_rule(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="<= 86400"):
        DiskTier(tmp_path / "disk", timeout=1e308)
    with pytest.raises(ConfigurationError, match="0 to 8 EiB"):
        DiskTier(tmp_path / "disk", max_bytes=10**400)
    with pytest.raises(ConfigurationError, match="without NUL"):
        DiskTier(str(tmp_path) + "/a\0b")
    with pytest.raises(ConfigurationError, match="<= 86400"):
        CircuitBreaker(1e308)
    if optional("redis") is None:
        return  # the rest builds Redis tiers
    from visioncache.tiers.redis import RedisTier

    with pytest.raises(ConfigurationError, match="<= 86400"):
        RedisTier("redis://127.0.0.1:1/0", socket_timeout=1e308)
    with pytest.raises(ConfigurationError, match="ten years"):
        RedisTier("redis://127.0.0.1:1/0", ttl_seconds=10**20)
