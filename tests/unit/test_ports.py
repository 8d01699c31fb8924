"""The PostgreSQL stores, the fences and the dead-letter sink implement the kernel's ports
(streams/billing/ports.py): mypy checks each module against its Protocol (the
assignments below), and the test checks that every member of a port exists."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from streams.billing import fencing, ports, store
from streams.billing.dead_letters import DeadLetters

Conn = psycopg.Connection[Any]

USAGE: ports.UsageStore[Conn] = store.usage
INVOICES: ports.InvoiceStore[Conn] = store.invoices
HOLDS: ports.HoldStore[Conn] = store.holds
CLOSES: ports.CloseStore[Conn] = store.closes
FENCES: ports.FenceStore[Conn] = fencing


def _members(protocol: type) -> set[str]:
    return {
        name
        for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [
        (ports.UsageStore, USAGE),
        (ports.InvoiceStore, INVOICES),
        (ports.HoldStore, HOLDS),
        (ports.CloseStore, CLOSES),
        (ports.FenceStore, FENCES),
        (ports.DeadLetterSink, DeadLetters),
    ],
    ids=["usage", "invoices", "holds", "closes", "fences", "dead-letters"],
)
def test_every_member_of_a_port_is_implemented(protocol: type, implementation: object) -> None:
    members = _members(protocol)
    assert members, f"{protocol.__name__} declares no member"
    missing = sorted(name for name in members if not callable(getattr(implementation, name, None)))
    assert not missing, f"{implementation!r} lacks {missing} of {protocol.__name__}"
