"""The price-book events on ``billing.price-book.v1``: published billable metrics and plan
versions.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, ClassVar

from pydantic import (
    Field,
    WithJsonSchema,
)

from streams.core.domain.events.account import (
    Code,
)
from streams.core.domain.events.fields import (
    Currency,
    EventData,
    UtcDateTime,
)

#: Pattern of a SHA-256 digest in lowercase hex.
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class BillableMetricPublished(EventData):
    """A billable metric of the price book was published (``billable_metric.published``,
    topic ``billing.price-book.v1``, key ``metric/<code>``). Immutable: a metric code
    is published with one definition for good (a redefinition needs a new code).

    ``definition`` is the metric as the price book states it, in canonical JSON
    (``schemas/price-book/price-book.schema.json``, ``$defs/BillableMetric``);
    ``content_sha256`` is the SHA-256 of that canonical JSON.
    """

    event_type: ClassVar[str] = "billable_metric.published"

    metric_code: Code
    definition: Annotated[
        dict[str, Any],
        WithJsonSchema(
            {
                "type": "object",
                "description": "A BillableMetric of the price book schema "
                "(schemas/price-book/price-book.schema.json#/$defs/BillableMetric), "
                "decimals as strings.",
            }
        ),
    ]
    content_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    published_at: UtcDateTime

    def record_key(self) -> str:
        return f"metric/{self.metric_code}"


class PlanVersionPublished(EventData):
    """A plan version of the price book was published (``plan_version.published``,
    topic ``billing.price-book.v1``, key ``plan/<plan code>/<version>``). Immutable:
    publishing the same version with other content is refused; a price change is a
    new version.

    ``definition`` is the version as the price book states it (version,
    effective_from, currency, charges) in canonical JSON
    (``schemas/price-book/price-book.schema.json``, ``$defs/PlanVersion``);
    ``content_sha256`` is the SHA-256 of that canonical JSON. ``plan_name`` is the
    plan's name when the version was published (not part of the content).
    """

    event_type: ClassVar[str] = "plan_version.published"

    plan_code: Code
    plan_name: Annotated[str, Field(max_length=256)] | None = None
    plan_version: Annotated[int, Field(ge=1)]
    effective_from: date
    currency: Currency
    definition: Annotated[
        dict[str, Any],
        WithJsonSchema(
            {
                "type": "object",
                "description": "A PlanVersion of the price book schema "
                "(schemas/price-book/price-book.schema.json#/$defs/PlanVersion), "
                "decimals as strings.",
            }
        ),
    ]
    content_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    published_at: UtcDateTime

    def record_key(self) -> str:
        return f"plan/{self.plan_code}/{self.plan_version}"
