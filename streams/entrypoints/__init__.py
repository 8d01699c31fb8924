"""The ``invoicing`` command (typer): every entry point of the product, one module per group.

=================  ====================================================================
module             commands
=================  ====================================================================
``app``            the root app, its callback (loads :class:`~streams.settings.Settings`
                   once per process into ``ctx.obj``) and ``main()`` (console script)
``common``         shared by the commands: consoles, the settings of a command, exit
                   codes from the logic's exceptions, log configuration
``stack``          ``stack up|down|status|logs|fetch``: the local stack
``db``             ``db migrate``
``topics``         ``topics create|list``: the registry's topics
``connectors``     ``connectors apply|status``: the Debezium outbox connector
``imports``        ``import focus|events``: a FOCUS CSV, or CloudEvents JSON lines, into
                   the account events
``plans``          ``plans validate|publish|list``: the price book (PostgreSQL + its topic)
``close``          ``close-period``: a close marker per customer with usage
``worker``         ``worker invoicing|email``: the stream processors
``replay``         ``replay``: re-read a period, report or correct the differences
``ops``            ``status``, ``reconcile [--focus FILE]``, ``holds``, ``fences``, ``outbox``
``invoices``       ``invoice void ID --reason TEXT``: void an issued invoice revision;
                   ``credit-note create ID --line N --amount A --reason TEXT`` (or
                   ``--lines FILE``): a partial credit note
``schemas``        ``schemas export|check|check-compat``: the topic contracts
``drill``          ``drill``: the double-invoicing incident, naive and safe
``demo``           ``demo [--scenario focus|pricing]``: the main job on the bundled FOCUS
                   sample, or the pricing scenario; ``generate-events``: its events
``config``         ``config show [--json]``: the effective settings, secrets masked;
                   ``config reference [--check]``: writes docs/configuration.md
=================  ====================================================================

A command parses its arguments, takes the settings from the root callback, builds
what the logic needs through :mod:`streams.bootstrap` (the composition root: only
entry points import it), calls the logic in its package (``streams.apps.importers``,
``streams.apps.ops``, ``streams.apps.replay``, ``streams.devtools.drill``, ...), prints, and maps the
logic's exceptions to exit codes (:func:`streams.entrypoints.common.exit_on`).
Heavy imports happen inside the commands, so ``invoicing --help`` stays fast.

``python -m streams.entrypoints …`` is the same command without the console script
(the worker processes of the demo, drill and tests are started that way).
"""
