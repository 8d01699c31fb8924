"""The isolated pipeline: the product's own harness for running the pipeline apart.

The drill (:mod:`streams.devtools.drill`) and the demo start real worker processes and,
for the drill's safe mode, a whole pipeline of their own on the shared stack; the
tests use the same pieces (``tests/support/pipeline.py`` adds what only tests need).

- :mod:`streams.devtools.sandbox.pipeline` — :func:`~streams.devtools.sandbox.pipeline.isolated_pipeline`:
  own database, topics, consumer groups, outbox connector, replication slot, SMTP
  sink and fake tax service; torn down after;
- :mod:`streams.devtools.sandbox.processes` — :class:`~streams.devtools.sandbox.processes.WorkerGroup`:
  ``invoicing worker …`` processes started and stopped from Python;
- :mod:`streams.devtools.sandbox.smtp` — the SMTP sink as a child process on a free port.

Being tools that create and drop what they connect to (databases, slots, topics,
connectors), these modules open their own short-lived admin connections from the
settings they are given, instead of receiving them from the composition root
(docs/decisions/0088-entry-points-and-the-composition-root.md).
"""
