"""The topic contracts as files: JSON Schema and AsyncAPI rendered from the models.

- :mod:`streams.devtools.schemas.render` — render, write and check the files of the
  repository's ``schemas/`` folder (the generated contracts) from the event models
  (:mod:`streams.core.domain.events`) and the topic registry (:mod:`streams.topics`);
- :mod:`streams.devtools.schemas.compat` — refuse a change of those files that would break
  an existing consumer of a topic version (``invoicing schemas check-compat``).

``python -m streams.devtools.schemas [folder]`` regenerates the files (the command the
generated files name); ``invoicing schemas export|check|check-compat`` is the
command group (:mod:`streams.entrypoints.schemas`).
"""
