"""``python -m streams.entrypoints …``: the ``invoicing`` command without the console script."""

from streams.entrypoints.app import main

main()
