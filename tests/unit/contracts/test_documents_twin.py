"""The contract of the document source (tests/contracts/documents.py) on the twin."""

from __future__ import annotations

import pytest

from streams.adapters.documents.source import InMemoryDocuments
from tests.contracts.documents import RECIPIENT, DocumentsContract, DocumentsHarness


class TestInMemoryDocuments(DocumentsContract):
    @pytest.fixture
    def harness(self) -> DocumentsHarness:
        twin = InMemoryDocuments()
        return DocumentsHarness(
            twin, lambda doc: twin.put(doc, recipient=RECIPIENT), twin.set_status
        )
