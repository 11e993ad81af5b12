"""The bounded, thread-safe store every cache level is an instance of: bounds, pins, single-flight,
eviction policies and exact counters. The face of the store package: it re-exports, and imports
nothing of the tiers."""

from visioncache.store.eviction import POLICIES, CostPolicy, EvictionPolicy, LRUPolicy, make_policy
from visioncache.store.store import Store
from visioncache.store.types import Claim, Entry, PutResult, StoreStats

__all__ = [
    "POLICIES",
    "Claim",
    "CostPolicy",
    "Entry",
    "EvictionPolicy",
    "LRUPolicy",
    "PutResult",
    "Store",
    "StoreStats",
    "make_policy",
]
