"""Helpers of the document-life tests (void, credit notes) on a sandbox pipeline: produce
account events, wait for a condition, read one value, find the emails the SMTP sink
stored, run a CLI command with the sandbox's environment."""

from __future__ import annotations

import time
from typing import Any, Protocol

import pytest
from typer.testing import CliRunner

from streams.adapters.kafka import make_producer
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, EventData
from streams.devtools.stack.maildir import list_messages
from streams.entrypoints.app import app
from tests.support.pipeline import Pipeline


class HasPipeline(Protocol):
    p: Pipeline


def produce(p: Pipeline, items: list[tuple[EventData, str]], *, source: str) -> None:
    """Produce ``items`` (data, event id) in order to the sandbox's topic; flushed."""
    producer = make_producer(p.settings.kafka)
    for data, event_id in items:
        record = encode(Envelope.wrap(data, id=event_id, source=source))
        producer.produce(
            p.topic,
            key=record.key,
            value=record.value,
            headers=list[tuple[str, str | bytes | None]](record.headers),
        )
    assert producer.flush(30) == 0


def wait_for(what: str, check: Any, p: Pipeline, timeout_s: float = 180.0) -> Any:
    """``check()``'s first truthy answer, polled every 0.5 s; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}\n{p.worker_logs()}")


def one(p: Pipeline, sql: str, *params: Any) -> Any:
    """The first column of the one row ``sql`` returns (as the owner)."""
    with p.connect() as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def sent_emails(p: Pipeline, header: str, value: str) -> list[Any]:
    """The messages of the sandbox's SMTP sink whose ``header`` is ``value``."""
    return [m for m in list_messages(p.maildir) if m[header] == value]


def cli(s: HasPipeline, *args: str) -> Any:
    """``invoicing ARGS…`` in-process with the sandbox's environment."""
    return CliRunner().invoke(app, list(args), env=s.p.env)
