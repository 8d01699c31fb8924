"""The fake tax service's knobs (:class:`FakeTaxConfig`), importable without the server.

The drill and the sandbox describe a fake's latency and faults before they start
one; importing this module does not import aiohttp or the server.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from streams.adapters.tax import wire


class FakeTaxConfig(BaseModel):
    """The fake's knobs; all latencies in seconds, rates and probabilities in 0..1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_latency_s: float = Field(0.02, ge=0)
    per_line_latency_s: float = Field(0.0, ge=0)
    spike_probability: float = Field(0.0, ge=0, le=1)
    spike_latency_s: float = Field(0.0, ge=0)
    #: Share of document requests answered ``error_status`` before any work.
    error_rate: float = Field(0.0, ge=0, le=1)
    error_status: int = Field(503, ge=400, le=599)
    #: Share of document requests held ``timeout_latency_s`` before answering.
    timeout_rate: float = Field(0.0, ge=0, le=1)
    timeout_latency_s: float = Field(60.0, ge=0)
    #: The next N document requests answer ``error_status`` (deterministic faults).
    fail_next: int = Field(0, ge=0)
    #: The next N document requests time out (deterministic faults).
    timeout_next: int = Field(0, ge=0)
    #: Lines allowed per document request (more → 413).
    max_lines: int = Field(wire.MAX_LINES_PER_REQUEST, ge=1)
    #: While true, every document request is answered only once it is set false again
    #: (after its latency): a test's barrier that keeps invoice jobs inside their tax
    #: call for exactly as long as the test needs, however slow the machine is.
    hold: bool = False
    #: Seed of the fault/latency draws; setting it (also via PUT) restarts the sequence.
    seed: int | None = None
    #: Rate changes: jurisdiction code (``US-WA``, ``GLOBAL``, …) → the standard rate it
    #: applies from now on (a decimal string), instead of the rate table's. A test's way
    #: of saying "the rate changed after the invoice was issued".
    rate_overrides: dict[str, str] = Field(default_factory=dict)
