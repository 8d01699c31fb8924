"""One contract suite per port (docs/conventions.md "Ports with two implementations").

Each module holds a base class per port (``…Contract``, not collected by itself)
whose tests use an abstract fixture for the implementation under test. The suite
runs twice, unchanged:

* ``tests/unit/contracts/test_<port>_twin.py`` on the in-memory twin
  (:mod:`streams.adapters.memory`), without services;
* ``tests/integration/contracts/test_<port>_real.py`` on the real adapter against
  the real service (the project's fake tax service process, the stack's Redis,
  the project's SMTP sink process).

A subclass provides the fixture and nothing else, so the twin cannot drift from
the real thing. Tests that concern one implementation only stay beside it.
"""
