"""Example subscriber of billing.invoices.v1: a ledger of invoice totals (see ledger.py
and docs/subscribing.md). Self-contained: it does not import the pipeline's package."""
