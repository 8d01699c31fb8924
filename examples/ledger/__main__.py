"""``python -m examples.ledger`` (from the repository root)."""

import sys

from .ledger import main

sys.exit(main())
