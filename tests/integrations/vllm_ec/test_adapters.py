"""LoRA adapters by content (`adapters`), and the scopes items are keyed in (`item_store`,
`scheduled_items`, `scopes`), without an engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.integrations.vllm_ec.tiny_lora import save_adapter
from visioncache.integrations.vllm.adapters import AdapterIdentities, adapter_digest
from visioncache.integrations.vllm.item_store import ItemStore, Scope
from visioncache.integrations.vllm.scheduled_items import ScheduledItems
from visioncache.tiers import DiskTier, TierChain

DIGEST = bytes(range(32))


def _lora(name: str, lora_id: int, path: Path, inplace: bool = False) -> SimpleNamespace:
    return SimpleNamespace(lora_name=name, lora_int_id=lora_id, lora_path=str(path), load_inplace=inplace)


def _rewrite(directory: Path, seed: int) -> None:
    """Other weights in the same files; their modification time moved on (a rewrite within one
    timestamp tick is the file system's limit, stated in `adapters`)."""
    before = {path: path.stat().st_mtime_ns for path in directory.iterdir()}
    save_adapter(directory, seed=seed)
    for path, mtime in before.items():
        if path.stat().st_mtime_ns == mtime:
            os.utime(path, ns=(mtime + 1_000_000, mtime + 1_000_000))


def _identities() -> AdapterIdentities:
    return AdapterIdentities(resolve=lambda path: os.path.abspath(path))


def test_an_adapter_is_its_files_not_its_name_or_path(tmp_path: Path) -> None:
    first = save_adapter(tmp_path / "a", seed=1)
    copy = Path(shutil.copytree(first, tmp_path / "elsewhere" / "renamed"))
    other = save_adapter(tmp_path / "b", seed=2)
    assert adapter_digest(first) == adapter_digest(copy) != adapter_digest(other)
    identities = _identities()
    assert identities.digest(_lora("x", 1, first)) == identities.digest(_lora("y", 2, copy))
    assert adapter_digest(tmp_path / "missing") is None


def test_regression_a_name_reloaded_in_place_keeps_the_old_adapters_identity(tmp_path: Path) -> None:
    # vLLM's in-place reload keeps the name and the id, and changes the path or the files.
    first, second = save_adapter(tmp_path / "a", seed=1), save_adapter(tmp_path / "b", seed=2)
    identities = _identities()
    before = identities.digest(_lora("x", 1, first))
    identities.loaded(_lora("x", 1, second, inplace=True))  # add_lora: the workers load B now
    assert identities.digest(_lora("x", 1, second, inplace=True)) == adapter_digest(second) != before
    # The files at one path rewritten, then reloaded in place: the new files' digest.
    _rewrite(second, seed=3)
    assert identities.digest(_lora("x", 1, second, inplace=True)) == adapter_digest(second)


def test_files_changed_under_a_loaded_adapter_without_a_reload_give_no_identity(tmp_path: Path) -> None:
    # The workers keep what they loaded until a reload or an eviction: either version may run.
    path = save_adapter(tmp_path / "a", seed=1)
    identities = _identities()
    assert identities.digest(_lora("x", 1, path)) is not None
    _rewrite(path, seed=2)  # same names, same sizes: other weights
    assert identities.digest(_lora("x", 1, path)) is None
    other = save_adapter(tmp_path / "b", seed=3)
    assert identities.digest(_lora("x", 1, other)) is None  # another path under a loaded id


def test_an_adapter_that_cannot_be_resolved_has_no_identity(tmp_path: Path) -> None:
    def fail(path: str) -> str:
        raise OSError("offline")

    assert AdapterIdentities(resolve=fail).digest(_lora("x", 1, tmp_path)) is None
    assert _identities().digest(_lora("x", 1, tmp_path / "empty-or-missing")) is None


def _store(tmp_path: Path) -> ItemStore:
    return ItemStore(TierChain([DiskTier(tmp_path / "tier")], max_pending_write_bytes=0), "scopes-test")


def test_keys_differ_by_tenant_adapter_and_weight_epoch_and_hide_the_digest(tmp_path: Path) -> None:
    store = _store(tmp_path)
    public, _ = store.key(DIGEST)
    tenant_a, _ = store.key(DIGEST, Scope(tenant="a"))
    tenant_b, _ = store.key(DIGEST, Scope(tenant="b"))
    adapter, namespace = store.key(DIGEST, Scope(adapter="f" * 64))
    assert len({public, tenant_a, tenant_b, adapter}) == 4
    assert DIGEST.hex() not in tenant_a and DIGEST.hex() not in tenant_b
    assert namespace == "scopes-test+adapter/" + "f" * 64
    store.new_epoch()
    assert store.key(DIGEST)[0] != public and store.key(DIGEST, Scope(tenant="a"))[0] != tenant_a
    assert store.namespace.startswith("scopes-test@weights-epoch/")
    store.close()


def test_a_saved_entry_is_read_only_in_its_own_scope_and_epoch(tmp_path: Path) -> None:
    import torch

    store = _store(tmp_path)
    value = torch.ones(2, 4, dtype=torch.bfloat16)
    key, namespace = store.key(DIGEST, Scope(tenant="a"))
    assert store.save(key, namespace, value, 1.0)
    loaded = store.load(key, num_embeds=2, dtype=torch.bfloat16)
    assert loaded is not None and torch.equal(loaded[0], value)
    assert store.load(store.key(DIGEST, Scope(tenant="b"))[0], num_embeds=2, dtype=torch.bfloat16) is None
    store.new_epoch()
    assert store.load(store.key(DIGEST, Scope(tenant="a"))[0], num_embeds=2, dtype=torch.bfloat16) is None
    store.close()


def _request(request_id: str, *identifiers: str) -> Any:
    position = SimpleNamespace(offset=0, length=4)
    features = [
        SimpleNamespace(identifier=name, mm_position=position, modality="image", data=None)
        for name in identifiers
    ]
    return SimpleNamespace(request_id=request_id, mm_features=features)


def test_identifiers_get_their_scopes_prefix_once_and_only_outside_the_default_scope() -> None:
    scopes = {"public": Scope(), "tenant": Scope(tenant="a")}
    items = ScheduledItems(
        lambda request: scopes[request.request_id],
        lambda scope: "" if scope == Scope() else "t:",
        lambda name, value: None,
    )
    public, tenant = _request("public", "h1"), _request("tenant", "h1")
    for _ in range(3):  # vLLM asks again every step: the prefix is applied once
        items.note_request(public, 0)
        items.note_request(tenant, 0)
    assert [f.identifier for f in public.mm_features] == ["h1"]
    assert [f.identifier for f in tenant.mm_features] == ["t:h1"]
    assert items.located("t:h1") == (tenant, 0) and items.located("h1") is None  # the last noted only
    tenant.mm_features.append(SimpleNamespace(identifier="h2", mm_position=tenant.mm_features[0].mm_position))
    items.note_request(tenant, 0)  # an item added later (a streaming input) is scoped when first seen
    assert [f.identifier for f in tenant.mm_features] == ["t:h1", "t:h2"]


def test_a_requests_cache_salt_is_its_tenant_unless_the_switch_shares_one_namespace(tmp_path: Path) -> None:
    from visioncache.integrations.vllm.scopes import Scopes

    store = _store(tmp_path)
    salted, unsalted = SimpleNamespace(cache_salt="s" * 43), SimpleNamespace(cache_salt=None)
    tenants = Scopes(store, ignore_cache_salt=False, adapters_reach_the_encoder=False)
    shared = Scopes(store, ignore_cache_salt=True, adapters_reach_the_encoder=False)
    assert tenants.scope_of(salted) == Scope(tenant="s" * 43) and tenants.scope_of(unsalted) == Scope()
    assert shared.scope_of(salted) == Scope() == shared.scope_of(unsalted)
    assert tenants.prefix(Scope()) == "" and tenants.prefix(Scope(tenant="a")).startswith("vc-")
    assert tenants.prefix(None) != tenants.prefix(None)  # an unkeyed scope shares with nothing
    store.new_epoch()
    assert tenants.prefix(Scope()).startswith("vc-")  # after a weight update, vLLM's cache too
    store.close()
