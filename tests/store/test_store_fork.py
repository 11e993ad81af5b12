"""A child forked while its parent's threads use a store never waits on them: claims in flight
and the store's lock are the parent's, not the child's."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.support.cache_values import (
    JOIN_SECONDS,
    A,
    B,
    Encoder,
    correct,
    value_of,
)
from tests.support.internals import level_store
from visioncache import (
    VisionEmbeddingCache,
)


# ---- what a forked child inherits from its parent's threads --------------
def _in_forked_child(request: Callable[[], bool], seconds: float = JOIN_SECONDS) -> int:
    """Fork; the child runs ``request`` on a thread and exits 0 if it returned True in time, 3 if
    it was still blocked, 1 if it failed. Returns the child's exit code."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            outcome: list[bool] = []
            thread = threading.Thread(target=lambda: outcome.append(request()), daemon=True)
            thread.start()
            thread.join(seconds)
            code = 3 if thread.is_alive() else (0 if outcome == [True] else 1)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_forked_child_waits_forever_on_a_claim_its_parent_owned() -> None:
    """With forks: a child forked while one of the parent's threads was encoding an
    image inherited that in-flight claim; its owner does not exist in the child, so the child's
    first request for the image waited forever. The child must compute it itself."""
    cache = VisionEmbeddingCache()
    encoding, release = threading.Event(), threading.Event()

    def slow_encoder(images: list[bytes]) -> list[np.ndarray]:
        encoding.set()
        assert release.wait(JOIN_SECONDS)
        return [value_of(image) for image in images]

    parent_request = threading.Thread(target=lambda: cache.encode_images([A], slow_encoder))
    parent_request.start()
    assert encoding.wait(JOIN_SECONDS)  # the parent's thread owns A's claim now
    try:
        code = _in_forked_child(lambda: correct(cache.encode_images([A], Encoder()), [A]), seconds=5.0)
    finally:
        release.set()
        parent_request.join(JOIN_SECONDS)
    assert code == 0, "the child's request for an image its parent was encoding " + (
        "never returned" if code == 3 else "failed"
    )
    assert correct(cache.get_image_embeddings([A]), [A])  # the parent's own claim completed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_forked_child_inherits_a_store_lock_held_by_a_parent_thread() -> None:
    """With forks: a child forked while another of the parent's threads was inside
    a store operation inherited the store's lock held, by a thread that does not exist in the
    child: the child's first miss waited forever (35 of 200 forks, with the parent storing values
    on a second thread). Simulated deterministically by holding the lock across the fork."""
    cache = VisionEmbeddingCache()
    store = level_store(cache, "embedding")
    holding, fork_started = threading.Event(), threading.Event()

    def store_operation_in_progress() -> None:
        with store._lock:  # what `put` or `claim` on another thread holds for a moment
            holding.set()
            fork_started.wait(JOIN_SECONDS)
            time.sleep(0.2)  # still inside when the fork begins

    other_thread = threading.Thread(target=store_operation_in_progress)
    other_thread.start()
    assert holding.wait(JOIN_SECONDS)
    fork_started.set()
    code = _in_forked_child(lambda: correct(cache.encode_images([B], Encoder()), [B]), seconds=5.0)
    other_thread.join(JOIN_SECONDS)
    assert code == 0, "the child's first miss " + ("never returned" if code == 3 else "failed")
