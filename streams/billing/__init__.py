"""The billing kernel: the ports the core calls (:mod:`streams.billing.ports`), stores, issuance, fencing, commit point."""
