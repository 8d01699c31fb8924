"""The Python runtime of a long-running process: the cyclic garbage collector's tuning.

Part of the composition root (:mod:`streams.bootstrap`).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("streams.bootstrap")

__all__ = ["tune_gc"]


def tune_gc(threshold: int) -> None:
    """Freeze the objects alive now (modules, settings, clients: ``gc.freeze``, so that no
    later collection scans them) and set the first generation's threshold to
    ``threshold`` allocations (Python's default 700; the older generations keep theirs).
    ``threshold`` 0 changes nothing. Call it once, after start-up.

    Why: a poll batch of the invoicing worker allocates tens of thousands of short-lived
    objects (records, decoded values, rows), none of them in reference cycles, so the
    default threshold runs collections that find nothing, each scanning every young
    object, and the older generations' collections scan the whole start-up heap
    (docs/decisions/0010-batch-first-ingest.md "The garbage collector"; the rules:
    the Python documentation of :mod:`gc`, ``gc.freeze`` and ``gc.set_threshold``).
    Reference counting still frees every acyclic object at once; only cyclic garbage
    waits for the next collection.
    """
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
    log.info("gc: %d start-up objects frozen, threshold %d", gc.get_freeze_count(), threshold)
