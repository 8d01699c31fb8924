"""Fields shared by every event contract: the id namespace, bounded text and identifier
types, UTC times, and the base class of every event's data (frozen, ``extra="forbid"``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    WithJsonSchema,
)

from streams.core.domain.periods import PERIOD_PATTERN

#: Namespace of the deterministic (uuid5) event and document ids of this project.
ID_NAMESPACE = uuid.UUID("6f1c8a52-3d0e-4f7b-9a55-2b7f0c1e9d41")

CURRENCY_PATTERN = r"^[A-Z]{3}$"


#: Earliest instant an event may carry (UTC): nothing billed here happened before it,
#: and billing periods start at 1970-01 (:class:`~streams.core.domain.periods.BillingPeriod`).
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("datetime must carry a time zone (UTC)")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+05:00: no such UTC datetime (found by fuzzing)
        raise ValueError("datetime is out of range once converted to UTC") from None
    if utc < EARLIEST_INSTANT:
        raise ValueError("datetime is before 1970-01-01T00:00:00Z")
    return utc


#: A timezone-aware datetime normalised to UTC, from 1970 to the year 9999; naive
#: values are refused.
UtcDateTime = Annotated[
    datetime,
    AfterValidator(_utc),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 date-time with an offset, from 1970-01-01T00:00:00Z to "
            "the year 9999 in UTC.",
        }
    ),
]

#: Characters no text field accepts (the contract's bound): the C0 control characters other than
#: TAB, LF and CR (NUL, which PostgreSQL cannot store in ``text``; ESC; BEL; …), DEL
#: and the C1 controls; the bidirectional embedding, override and isolate controls
#: U+202A-U+202E and U+2066-U+2069 (text that displays unlike its content,
#: CVE-2021-42574). Lone surrogates (``"\ud800"`` in JSON) are refused as well: they
#: are no Unicode characters and have no UTF-8 form (RFC 7493, I-JSON §2.1). TAB, LF
#: and CR stay: FOCUS descriptions span lines, and whoever renders text into a
#: line-oriented format (mail headers) folds it there (``streams.apps.email.render``).
TEXT_PATTERN = (
    r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]*$"
)
#: An email address: one ``@``, no white space, no control characters.
EMAIL_PATTERN = r"^[^@\s\u0000-\u001f\u007f-\u009f]+@[^@\s\u0000-\u001f\u007f-\u009f]+$"
#: Largest value of a PostgreSQL ``integer`` (revisions, counts, plan versions, partitions).
MAX_INT32 = 2**31 - 1
#: Largest value of a PostgreSQL ``bigint`` (offsets, fencing numbers).
MAX_INT64 = 2**63 - 1

#: Text of at most N characters, without the characters :data:`TEXT_PATTERN` refuses.
Text64 = Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)]
Text128 = Annotated[str, Field(max_length=128, pattern=TEXT_PATTERN)]
Text256 = Annotated[str, Field(max_length=256, pattern=TEXT_PATTERN)]
Text512 = Annotated[str, Field(max_length=512, pattern=TEXT_PATTERN)]
Text1024 = Annotated[str, Field(max_length=1024, pattern=TEXT_PATTERN)]
Text2000 = Annotated[str, Field(max_length=2000, pattern=TEXT_PATTERN)]
#: A person's or company's name: 1 to 512 characters.
Name = Annotated[str, Field(min_length=1, max_length=512, pattern=TEXT_PATTERN)]
#: A document id: 1 to 64 characters.
DocumentRef = Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]
#: A document number (``INV-2024-09-000042``): 1 to 64 characters, written by the
#: issuance from a counter (whoever renders it escapes it, ``streams.apps.email.render``).
DocumentNumber = Annotated[str, Field(min_length=1, max_length=64)]
Email = Annotated[str, Field(pattern=EMAIL_PATTERN, max_length=320)]
#: The recipient named on an invoice event: bounded text; whether it is an address
#: is the email sender's business (a bad one is a recorded render failure).
Recipient = Annotated[str, Field(max_length=320, pattern=TEXT_PATTERN)]
Int32 = Annotated[int, Field(ge=0, le=MAX_INT32)]
Revision = Annotated[int, Field(ge=1, le=MAX_INT32)]

#: Customer id (the Kafka key). "/" is allowed: real provider account ids contain it
#: (Azure "/subscriptions/<uuid>" in the FOCUS sample).
CUSTOMER_ID_PATTERN = r"^[A-Za-z0-9._:/-]+$"
CustomerId = Annotated[str, Field(min_length=1, max_length=128, pattern=CUSTOMER_ID_PATTERN)]
Period = Annotated[str, Field(pattern=PERIOD_PATTERN)]
Currency = Annotated[str, Field(pattern=CURRENCY_PATTERN)]


_DATETIME_JSON: TypeAdapter[datetime] = TypeAdapter(datetime)


def datetime_json(value: datetime) -> str:
    """The JSON text (unquoted) the models give a date-time, e.g. ``2024-09-18T22:00:00Z``."""
    return str(_DATETIME_JSON.dump_python(value, mode="json"))


def deterministic_id(*parts: str) -> str:
    """A stable UUID (v5) from ``parts``: the same inputs give the same id, so a
    resend of the same fact deduplicates downstream."""
    return str(uuid.uuid5(ID_NAMESPACE, "\x1f".join(parts)))


class EventData(BaseModel):
    """Base of every event's data: frozen, no unknown fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)

    #: CloudEvents ``type`` of events carrying this data.
    event_type: ClassVar[str]
    schema_version: Literal[1] = 1

    def record_key(self) -> str:
        """The Kafka record key (and CloudEvents ``subject``) of events carrying this
        data: the customer id for account and invoice events; the entry's key for
        price book publications (:class:`PlanVersionPublished`)."""
        return str(getattr(self, "customer_id"))  # noqa: B009 - every other event names its customer
