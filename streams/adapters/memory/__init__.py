"""In-memory twins of the ports: every port of :mod:`streams.billing.ports` has one here.

A twin is a real implementation of its port that keeps its state in memory, for
fast unit tests of the code that calls the port (no service, no mock). Each twin
passes the same contract suite as its real adapter (``tests/contracts/``: run on
the twin in ``tests/unit/contracts/``, on the adapter against the real service in
``tests/integration/contracts/``), so a twin cannot drift from the real thing.
Twins also let a test script failures (``fail_next``, ``down``) and see what was
called.

* :mod:`~streams.adapters.memory.tax` — :class:`~streams.adapters.memory.tax.InMemoryTaxService`
  (the fake tax service's own engine, so it answers what the fake HTTP service answers)
* :mod:`~streams.adapters.memory.tax_cache` — :class:`~streams.adapters.memory.tax_cache.InMemoryTaxCache`
  (a dict with Redis-like expiry)
* :mod:`~streams.adapters.memory.mail` — :class:`~streams.adapters.memory.mail.InMemoryMailTransport`
  (records each message; refuses what the SMTP sink refuses)

Nothing is re-exported here: import a twin from its module.
"""
