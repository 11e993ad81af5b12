"""`WorkerSaves`: the outputs a worker encodes, handed to the tiers' background writer at the end
of each step, and accounted for at shutdown.

The model step never waits for disk or Redis: ``save_caches`` only notes an output; the step's end
queues a host copy (bounded in bytes; a full budget drops the save and counts it). At shutdown
vLLM gives a worker a grace period, then kills it (`VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`, then 4
seconds after SIGTERM). So the writer is flushed for a deadline inside that period, whatever it
could not write by then is dropped and counted, and one log line says what became of every save:
none is lost uncounted. (A worker killed from outside before it shuts down, by the OOM killer
say, loses its queue without a word; the tiers stay consistent and a restart encodes it again.)
"""

from __future__ import annotations

import logging
import time

import torch

from visioncache.integrations.vllm.counters import ConnectorCounters
from visioncache.integrations.vllm.engine_stats import WorkerCounts
from visioncache.integrations.vllm.item_store import ItemStore

__all__ = ["SHUTDOWN_MARGIN_SECONDS", "WorkerSaves", "shutdown_seconds"]

# vLLM configures the "vllm" logger only: its children print in vLLM's log, at its level and format.
logger = logging.getLogger("vllm.visioncache")
# vLLM's wait between SIGTERM and SIGKILL (v1/executor/multiproc_executor.py, 0.32 and 0.33).
_SIGTERM_GRACE_SECONDS = 4.0
# Left for the rest of the worker's shutdown (closing the tiers, distributed teardown).
SHUTDOWN_MARGIN_SECONDS = 3.0


def shutdown_seconds() -> float:
    """How long a worker may flush at shutdown before vLLM kills it, less the margin."""
    try:
        from vllm import envs

        grace = float(envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)
    except Exception:  # pragma: no cover - vLLM always has it in the supported releases
        grace = 5.0
    return max(1.0, grace + _SIGTERM_GRACE_SECONDS - SHUTDOWN_MARGIN_SECONDS)


class WorkerSaves:
    """This step's outputs to save (noted under their keys), and every save's fate since start."""

    def __init__(self, store: ItemStore, counters: ConnectorCounters) -> None:
        self.store = store
        self.counters = counters
        self._pending: list[tuple[str, str, torch.Tensor]] = []
        self._started: float | None = None
        self.queued = 0  # handed to the writer
        self.dropped_full = 0  # not queued: the writer's byte budget was full

    def start_step(self) -> None:
        self._started = time.perf_counter()

    def note(self, key: str, namespace: str, output: torch.Tensor) -> None:
        """Save ``output`` under the tier ``key`` (of ``namespace``) at the end of the step."""
        self._pending.append((key, namespace, output))

    def end_step(self) -> WorkerCounts | None:
        """Queue this step's outputs (each costed at its share of the encoder phase)."""
        if not self._pending:
            return None
        saves, self._pending = self._pending, []
        elapsed = time.perf_counter() - self._started if self._started is not None else 0.0
        cost = elapsed / len(saves)
        counts = WorkerCounts(encoded_items=len(saves), encode_seconds=elapsed)
        for key, namespace, tensor in saves:
            if self.store.save(key, namespace, tensor, cost):
                counts.saves += 1
                counts.saved_bytes += tensor.nbytes
            else:
                counts.saves_dropped += 1
        self.queued += counts.saves
        self.dropped_full += counts.saves_dropped
        for name, delta in self.counters.tier_deltas().items():  # earlier steps' background writes
            setattr(counts, name, delta)
        return counts

    def shutdown(self, deadline: float) -> None:
        """Queue what is noted, flush for up to ``deadline`` seconds, close the tiers, and log
        what became of every save."""
        self.end_step()
        started = time.monotonic()
        closed = self.store.close(deadline)
        logger.info(
            "VisionCacheECConnector shutdown: %d encoder outputs queued for the tiers since start, "
            "%d written, %d dropped unwritten at shutdown, %d still being written at the deadline "
            "(flushed %.1f s of %.1f s); %d not queued earlier (writer budget full)",
            self.queued,
            self.queued - closed.dropped - closed.unfinished,
            closed.dropped,
            closed.unfinished,
            time.monotonic() - started,
            deadline,
            self.dropped_full,
        )
