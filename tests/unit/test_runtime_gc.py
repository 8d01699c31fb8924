"""The long-running processes' garbage-collector tuning (streams/bootstrap/runtime.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streams.bootstrap.runtime import tune_gc
from streams.settings import Settings


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_a_threshold_freezes_the_start_up_heap_and_sets_the_first_generation() -> None:
    gc.unfreeze()
    _, older, oldest = gc.get_threshold()
    tune_gc(25_000)
    assert gc.get_threshold() == (25_000, older, oldest)
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("restored_gc")
def test_zero_keeps_pythons_defaults() -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    tune_gc(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_worker_default_is_tuned_and_zero_is_allowed() -> None:
    assert Settings().worker.gc_threshold > 700
    assert Settings(worker={"gc_threshold": 0}).worker.gc_threshold == 0
