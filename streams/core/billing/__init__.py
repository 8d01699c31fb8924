"""The billing kernel: what every consumer of the account events shares.

The invoicing worker, the replay, the email sender and the operator commands
use these modules, never one another's internals:

=========================  =====================================================
:mod:`.rows`               typed rows (frozen dataclasses) the stores read and write
:mod:`.store`              PostgreSQL statements, one module per table family
:mod:`.fencing`            the three fences: partition, lease, close request
:mod:`.issuance`           the one issuance transaction (fence, number, invoice,
                           lines, outbox, optional credit note)
:mod:`.commit`             the one commit point: database commit, then offset commit
:mod:`.dead_letters`       the dead-letter sink and the holds it leads to
:mod:`.metrics`            the kernel's Prometheus metrics
:mod:`.ports`              the ports the core calls: tax, tax cache, mail transport,
                           the stores, the fences and the dead-letter sink
=========================  =====================================================

Nothing here builds a client from settings: callers pass pools, consumers and
producers in (the composition root is :mod:`streams.bootstrap`).
"""
