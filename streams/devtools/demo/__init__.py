"""``invoicing demo``: the main job, end to end, on the bundled real FOCUS sample
(``--scenario focus``, the default; the pricing scenario is :mod:`streams.devtools.demo.pricing`).

1. brings the local stack up (idempotent);
2. imports the FOCUS 1.0 CSV into ``billing.account-events.v1``;
3. starts a group of invoicing workers (default 3, separate processes) and one
   email sender;
4. closes every billing period present in the file (``close-period``);
5. waits, with a progress bar, until every (customer, period) of the file has an
   invoice and every invoice's email is settled (sent, or recorded as not sent
   with a reason: zero total, refused by SMTP, not renderable);
6. prints the reconciliation: for each (customer, month) the exact sum of
   ``BilledCost`` (read with the ``csv`` module, independently of the importer)
   rounded once (half-even, minor unit) against the invoice subtotal, then the
   summary. Exit status 1 on any mismatch, missing invoice, or invoice with a
   non-zero total that was not emailed.

Running it again changes nothing: the import deduplicates, the close markers
have the same ids, and the invoices already exist (the table shows the same
result).

Modules: :mod:`streams.apps.ops.focus_expected` (what the file says each customer owes, read
independently of the importer), :mod:`streams.devtools.demo.run` (the run and its
reconciliation).
"""
