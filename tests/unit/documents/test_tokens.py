"""Hosted-page tokens (streams/adapters/documents/tokens.py): signed, bound to one
document, expiring, deterministic, rotatable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from streams.adapters.documents.tokens import PageLinks, TokenSigner

SECRET = "s" * 32
DOC = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
ISSUED = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)
NOW = datetime(2026, 11, 15, tzinfo=UTC)


def test_a_token_opens_its_document_until_it_expires() -> None:
    signer = TokenSigner([SECRET])
    token = signer.sign_for("invoice", DOC, ISSUED, timedelta(days=30))
    target = signer.verify(token, now=NOW)
    assert target is not None
    assert (target.kind, target.document_id) == ("invoice", DOC)
    assert target.expires_at == datetime(2026, 12, 1, 0, 5, tzinfo=UTC)
    assert signer.verify(token, now=datetime(2026, 12, 1, 0, 5, tzinfo=UTC)) is None
    assert signer.verify(token, now=datetime(2026, 12, 1, 0, 4, 59, tzinfo=UTC)) is not None


def test_the_same_document_gets_the_same_token() -> None:
    signer = TokenSigner([SECRET])
    assert signer.sign_for("invoice", DOC, ISSUED, timedelta(days=1)) == signer.sign_for(
        "invoice", DOC.upper(), ISSUED, timedelta(days=1)
    )


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # signature changed
        lambda t: "x" + t,  # payload changed
        lambda t: "",
        lambda t: "not-a-token",
        lambda t: t.split(".")[0],  # signature removed
    ],
)
def test_a_forged_or_malformed_token_is_refused(mangle: object) -> None:
    signer = TokenSigner([SECRET])
    token = signer.sign_for("invoice", DOC, ISSUED, timedelta(days=30))
    assert callable(mangle)
    assert signer.verify(mangle(token), now=NOW) is None


def test_another_secret_refuses_and_a_previous_one_still_verifies() -> None:
    old = TokenSigner(["o" * 32]).sign_for("invoice", DOC, ISSUED, timedelta(days=30))
    assert TokenSigner([SECRET]).verify(old, now=NOW) is None
    rotated = TokenSigner([SECRET, "o" * 32])
    assert rotated.verify(old, now=NOW) is not None
    fresh = rotated.sign_for("invoice", DOC, ISSUED, timedelta(days=30))
    assert TokenSigner([SECRET]).verify(fresh, now=NOW) is not None  # signed with the first


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        TokenSigner(["short"])
    with pytest.raises(ValueError):
        TokenSigner([])


def test_links_name_the_document_kind() -> None:
    links = PageLinks("https://billing.example/", TokenSigner([SECRET]), timedelta(days=90))
    url = links.url("invoice", DOC, ISSUED)
    assert url.startswith(f"https://billing.example/invoices/{DOC}?t=")
    assert links.url("credit_note", DOC, ISSUED).startswith(
        f"https://billing.example/credit-notes/{DOC}?t="
    )
    token = url.split("?t=", 1)[1]
    target = links.signer.verify(token, now=NOW)
    assert target is not None and target.kind == "invoice"
