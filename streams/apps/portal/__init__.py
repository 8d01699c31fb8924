"""The hosted invoice page (``invoicing worker portal``): docs/email.md, "The hosted page"."""
