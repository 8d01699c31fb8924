"""The tax service's client side: the HTTP client, its Redis cache, and the wire format.

* :mod:`streams.adapters.tax.wire` — what both ends of the HTTP API share (the
  client here and the fake service :mod:`streams.devtools.stack.fake_tax`): request and
  answer bodies, ``chunk_key``, the 1,000-line limit, the document fingerprint,
  ``tax_of``. Imports neither the client nor the fake.
* :mod:`streams.adapters.tax.client` — :class:`~streams.adapters.tax.client.HttpTaxService`,
  the :class:`~streams.core.billing.ports.TaxService` over HTTP (timeouts, retries that
  reuse the idempotency key, bounded concurrency, chunking).
* :mod:`streams.adapters.tax.cache` — :class:`~streams.adapters.tax.cache.RedisTaxCache`,
  the :class:`~streams.core.billing.ports.TaxCache` in Redis.

The port, its errors and :class:`~streams.core.billing.ports.Rate` are in
:mod:`streams.core.billing.ports`; the in-memory twins in :mod:`streams.adapters.memory`.
Nothing is re-exported here: import from the module that defines a name.
"""
