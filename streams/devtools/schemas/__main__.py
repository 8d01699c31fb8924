"""``python -m streams.devtools.schemas [folder]``: regenerate the contract files (default ``./schemas``)."""

from streams.devtools.schemas.render import main

raise SystemExit(main())
