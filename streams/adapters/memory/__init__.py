"""In-memory twins of the ports: every port of :mod:`streams.core.billing.ports` has one here.

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
* :mod:`~streams.adapters.memory.kafka` — :class:`~streams.adapters.memory.kafka.InMemoryKafka`
  (topics, a cooperative-sticky group coordinator, committed offsets; its
  ``consumer()`` / ``producer()`` are the ``KafkaSource`` / ``KafkaSink`` twins)
* :mod:`~streams.adapters.memory.database` — :class:`~streams.adapters.memory.database.InMemoryDatabase`
  (the ``Database`` twin: tables, serialised transactions with rollback and savepoints,
  psycopg's errors, scripted failures)
* :mod:`~streams.adapters.memory.store` (``usage``, ``invoices``, ``holds``, ``closes``) and
  :mod:`~streams.adapters.memory.fencing` — the store twins, functions of a
  :class:`~streams.adapters.memory.database.MemoryConnection` as the PostgreSQL stores are
  functions of a psycopg connection; :data:`streams.adapters.memory.stores.MEMORY` is the set
* :mod:`~streams.apps.email.twin` — :class:`~streams.apps.email.twin.InMemoryDeliveryStore`
  (the email sender's ``Deliveries`` port, on the same database)
* :mod:`~streams.adapters.memory.dead_letters` — :class:`~streams.adapters.memory.dead_letters.InMemoryDeadLetterSink`
  (the real ``DeadLetters`` on an in-memory topic)

A worker on the twins::

    kafka, db = InMemoryKafka(), InMemoryDatabase()
    kafka.create_topics(topic_specs(settings.kafka))
    worker = InvoicingWorker(settings, pool=db, stores=MEMORY, tax=InMemoryTaxService(),
                             consumer=kafka.consumer(group), producer=kafka.producer())

**Adding a store to the twin** (say a ``RatingStore`` port with PostgreSQL functions in
``streams/core/billing/store/rating.py``):

1. its tables: a frozen row dataclass and a table name per table in
   :mod:`streams.adapters.memory.store.tables` (columns as in the migration; the key
   the row is stored under in the table's dict);
2. ``streams/adapters/memory/store/rating.py``: the same functions with the same
   signatures, ``conn: MemoryConnection`` first; each body is one
   ``with conn.statement("rating.<function>") as stmt:`` block that reads and writes
   ``stmt.table(NAME)`` (replace rows, never mutate them), uses ``stmt.now`` for
   ``now()``, ``stmt.next_value(seq)`` for a sequence, and raises
   ``stmt.unique_violation(...)`` / ``stmt.check_violation(...)`` where PostgreSQL
   raises; ``ON CONFLICT DO NOTHING`` is "look, and return if it is there";
3. a field in :class:`streams.core.billing.stores.Stores`, the PostgreSQL module in
   ``POSTGRES`` and this module in :data:`streams.adapters.memory.stores.MEMORY`
   (mypy then checks both modules against the Protocol);
4. a contract suite ``tests/contracts/rating_store.py`` with a ``StoreHarness`` fixture,
   run by ``tests/unit/contracts/test_rating_store_twin.py`` (``memory_harness()``) and
   ``tests/integration/contracts/test_rating_store_real.py`` (``store_harness``);
   break the twin once to see the suite fail.

A new event type needs nothing here: the Kafka twin carries bytes.

Nothing is re-exported here: import a twin from its module.
"""
