"""Tests use the product's sandbox (streams/devtools/sandbox/): an isolated pipeline per test.

:class:`Pipeline` adds to the sandbox's pipeline what only tests use: the other
topics' names and the workers' logs for failure messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ParamSpec

from streams.devtools.sandbox import pipeline as sandbox
from streams.devtools.sandbox.smtp import free_port
from streams.topics import ACCOUNT_EVENTS_DLQ, INVOICES

__all__ = ["Pipeline", "free_port", "isolated_pipeline"]

P = ParamSpec("P")


class Pipeline(sandbox.Pipeline):
    """The sandbox's pipeline, plus test helpers."""

    @classmethod
    def of(cls, base: sandbox.Pipeline) -> Pipeline:
        """The same sandbox (same settings, files, tax service and worker group)."""
        pipeline = cls(base.unique, base.settings, base.env, base.workdir, base.maildir, base.tax)
        pipeline.workers = base.workers  # the group the sandbox stops at teardown
        return pipeline

    @property
    def dlq_topic(self) -> str:
        return ACCOUNT_EVENTS_DLQ.with_prefix(self.settings.kafka.topic_prefix).name

    @property
    def invoices_topic(self) -> str:
        return INVOICES.with_prefix(self.settings.kafka.topic_prefix).name


def _yielding_test_pipelines(
    make: Callable[P, contextlib.AbstractContextManager[sandbox.Pipeline]],
) -> Callable[P, contextlib.AbstractContextManager[Pipeline]]:
    @contextlib.contextmanager
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> Iterator[Pipeline]:
        with make(*args, **kwargs) as pipeline:
            yield Pipeline.of(pipeline)

    return wrapped


#: :func:`streams.devtools.sandbox.pipeline.isolated_pipeline` (same arguments), yielding a :class:`Pipeline`.
isolated_pipeline = _yielding_test_pipelines(sandbox.isolated_pipeline)
