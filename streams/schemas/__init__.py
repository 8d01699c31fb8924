"""The topic contracts as files: JSON Schema and AsyncAPI rendered from the models.

- :mod:`streams.schemas.render` — render, write and check the files of the
  repository's ``schemas/`` folder (the generated contracts) from the event models
  (:mod:`streams.domain.events`) and the topic registry (:mod:`streams.topics`);
- :mod:`streams.schemas.compat` — refuse a change of those files that would break
  an existing consumer of a topic version (``invoicing schemas check-compat``).

``python -m streams.schemas [folder]`` regenerates the files (the command the
generated files name); ``invoicing schemas export|check|check-compat`` is the
command group (:mod:`streams.entrypoints.schemas`).
"""
