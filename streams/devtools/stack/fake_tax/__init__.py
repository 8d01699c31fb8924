"""Fake third-party tax service: a real HTTP server for development, tests, drills, benchmarks.

Run::

    python -m streams.devtools.stack.fake_tax --host 127.0.0.1 --port 18090 \\
        --record-file .local/data/tax/requests.jsonl \\
        [--base-latency-s 0.02] [--per-line-latency-s 0] [--spike-probability 0] \\
        [--spike-latency-s 0] [--error-rate 0] [--error-status 503] [--timeout-rate 0] \\
        [--timeout-latency-s 60] [--max-lines 1000] [--seed N] [--port-file PATH] \\
        [--log-level INFO]

``--port 0`` binds a free port; ``--port-file`` then receives the port number
once the server listens. SIGTERM or SIGINT stop it (requests still sleeping are
cancelled after one second). Logs go to stderr, one line per fault or refusal
and per configuration change; successful requests log at DEBUG.

API (JSON bodies; money and rates are decimal **strings**, JSON numbers are refused):

``POST /v1/documents`` — tax a document::

    request  {"idempotency_key": str, "customer_id": str, "currency": "USD", "commit": bool,
              "lines": [{"line_id": str, "amount": "12.50", "region_id": str|null,
                         "tax_code": str|null}]}            (1..max_lines lines)
    200      {"document_id": str, "idempotency_key": str,
              "lines": [{"line_id", "tax_code": "US-WA-STD", "rate": "0.065", "tax": "0.8125"}]}
             header "Idempotent-Replayed: true" when it is a stored answer
    413      more than max_lines lines       422  invalid request (bad JSON, a numeric
    409      key committed with other lines       amount, unknown product tax_code, …)
    503      injected error (error_rate / fail_next)
    errors   {"error": {"code": str, "message": str}}

  ``tax = amount * rate`` exactly (no rounding; negative amounts give negative
  tax); the rate table and the idempotency rules are
  :class:`streams.adapters.memory.tax_engine.TaxLedger`'s (region id → jurisdiction, unknown
  ``us-*``/``eu-*``/``ap-*`` by prefix, ``null``/``global``/others → ``GLOBAL``;
  product codes ``STD`` (default) and ``EXEMPT``). ``commit=true`` stores the
  answer under the key: the same key and content answer the stored result (a
  *replay*), other content → 409. ``commit=false`` is a quote, nothing stored.

``GET /v1/rates?region_id=..&tax_code=..`` — ``{"region_id", "tax_code", "rate"}``: the
  code and rate a line of that region (and product code) gets. Base latency only,
  no injected faults.

Admin (for tests and drills):

``GET /health``                  ``{"status": "ok", "documents": n, "requests": n}``
``GET /admin/requests``          ``{"requests": [record, …]}``; filters ``kind=document|rate``,
                                 ``key_prefix=…``
``DELETE /admin/requests``       forget the records in memory (the file keeps them)
``GET /admin/config``            the knobs (:class:`FakeTaxConfig`)
``PUT /admin/config``            change some knobs: ``{"error_rate": 0.2, "seed": 7}``;
                                 422 on an unknown knob or a value out of range

Latency model, per document request: ``base_latency_s + per_line_latency_s *
lines``, plus ``spike_latency_s`` with probability ``spike_probability``. Before
any work, a share ``error_rate`` of requests (and the next ``fail_next``) answer
``error_status`` (503). A share ``timeout_rate`` (and the next ``timeout_next``)
are processed (so committed), then held for ``timeout_latency_s`` — far past a
client's read timeout — before answering: the client's retry with the same key
then gets the stored answer. Every draw comes from one ``random.Random(seed)``,
three draws per valid document request, so a seeded run repeats.

Records (:class:`RequestRecord`), one per request, kept in memory and appended as
JSON lines to ``--record-file``; written when the request is decided, before its
delay, so a timed-out request is visible at once::

    {"seq": 1, "kind": "document", "received_at": "2025-01-31T12:00:00.123456Z",
     "idempotency_key": "inv-1:0", "customer_id": "c1", "line_count": 3, "commit": true,
     "outcome": "ok", "status": 200, "latency_s": 0.02, "document_id": "doc_…"}

``outcome``: ``ok``, ``replay``, ``error`` (injected), ``timeout``, ``conflict``,
``invalid`` (413/422).

Modules:

* :mod:`~streams.adapters.memory.tax_engine` — the rate table and the ledger of committed
  documents (also the engine of the in-memory twin :mod:`streams.adapters.memory.tax`,
  so the twin and this server compute the same answers);
* :mod:`~streams.devtools.stack.fake_tax.server` — the aiohttp server, its knobs
  (:class:`FakeTaxConfig`) and records (:class:`RequestRecord`), the command line;
* :mod:`~streams.devtools.stack.fake_tax.process` — :func:`running_fake_tax` starts the
  server as a subprocess on a free port and :class:`FakeTaxAdmin` drives its admin
  API (for tests and drills).

The request and answer bodies are :mod:`streams.adapters.tax.wire`'s, shared with
the real client.
"""

from typing import TYPE_CHECKING, Any

from streams.devtools.stack.fake_tax.config import FakeTaxConfig

if TYPE_CHECKING:
    from streams.devtools.stack.fake_tax.process import (
        FakeTaxAdmin,
        FakeTaxProcess,
        running_fake_tax,
    )
    from streams.devtools.stack.fake_tax.server import (
        FakeTaxServer,
        Outcome,
        RequestRecord,
        build_parser,
        main,
        serve,
    )

#: Names re-exported from the server and process modules, imported on first use so that
#: ``import streams.devtools.stack.fake_tax`` (e.g. for :class:`FakeTaxConfig`) stays light: the
#: server pulls in aiohttp, which costs seconds of start-up in every worker process.
_LAZY = {
    "FakeTaxAdmin": "process",
    "FakeTaxProcess": "process",
    "running_fake_tax": "process",
    "FakeTaxServer": "server",
    "Outcome": "server",
    "RequestRecord": "server",
    "build_parser": "server",
    "main": "server",
    "serve": "server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "FakeTaxAdmin",
    "FakeTaxConfig",
    "FakeTaxProcess",
    "FakeTaxServer",
    "Outcome",
    "RequestRecord",
    "build_parser",
    "main",
    "running_fake_tax",
    "serve",
]
