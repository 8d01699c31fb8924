"""``python -m streams.devtools.stack.fake_tax``: run the fake tax service (see the package docstring)."""

import sys

from streams.devtools.stack.fake_tax.server import main

if __name__ == "__main__":
    sys.exit(main())
