"""Text that PostgreSQL can store, for the columns that quote what a bad record said.

A dead letter's reason, a hold's reason and the event id read from a bad record's
``ce_id`` header come from input that failed validation: they may hold a NUL
(PostgreSQL ``text`` refuses it; psycopg raises ``DataError`` before sending) or
a lone surrogate (no UTF-8 form; ``UnicodeEncodeError``). Writing them as they are
would make the very write that records the bad record fail, for ever.
"""

from __future__ import annotations

__all__ = ["safe_text"]


def safe_text(value: str, limit: int) -> str:
    """``value`` with NUL written ``\\x00`` and each lone surrogate as ``?``, cut to ``limit``."""
    cleaned = value.replace("\x00", "\\x00")
    cleaned = cleaned.encode("utf-8", "replace").decode("utf-8")  # surrogates → "?"
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"
