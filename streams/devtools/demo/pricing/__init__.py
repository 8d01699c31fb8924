"""``invoicing demo --scenario pricing``: the second real scenario (examples/pricing/README.md).

"Relay", an API platform (``examples/pricing/``): its price book, N customers
with subscriptions (mid-period starts, plan changes, an end, a round trip),
metered usage spread over one month, duplicates resent, a few customers with
pass-through lines, billed end to end and checked against an answer computed
without the rating code.

Modules:

* :mod:`streams.devtools.demo.pricing.generator` — the seeded generator of the events
  (CloudEvents JSON lines);
* :mod:`streams.devtools.demo.pricing.expected` — the independent answer: every
  customer's expected lines and subtotal from the book's YAML and the events,
  with its own arithmetic (it imports nothing of :mod:`streams.core.domain`);
* :mod:`streams.devtools.demo.pricing.run` — the demo run and its reconciliation.
"""
