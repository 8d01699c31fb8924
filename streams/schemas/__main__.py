"""``python -m streams.schemas [folder]``: regenerate the contract files (default ``./schemas``)."""

from streams.schemas.render import main

raise SystemExit(main())
