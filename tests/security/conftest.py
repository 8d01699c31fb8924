"""Security tier (docs/security.md): one test per finding of the security review, each able
to fail before its fix. Runs in phase 1 of ``make test`` (scripts/test-tiers.sh).

The tests of this folder need no service (the edge's aiohttp application runs in process,
:mod:`tests.security.edge`; settings are only parsed). Those of ``db/`` need the real stack
(PostgreSQL for the constraints, stores and roles): their session's ``stack`` fixture
(tests/support/fixtures.py) starts it when it is not running and fails loudly when it
cannot, never skips.
"""
