"""The usage view (docs/usage-api.md): usage to date and the upcoming invoice per customer.

* :mod:`~streams.apps.usage_view.state` — the tables' values and how an event changes them (pure);
* :mod:`~streams.apps.usage_view.preview` — the answer, rated by ``streams.core.domain.rating.rate`` (pure);
* :mod:`~streams.apps.usage_view.price_book` — where the price book comes from (file / published);
* :mod:`~streams.core.domain.http` — the HTTP bodies (JSON Schema in ``schemas/http/``);
* :mod:`~streams.apps.usage_view.app` — the faust-streaming app: tables, agent, routing, web;
* :mod:`~streams.apps.usage_view.metrics` — Prometheus metrics (view and ingest edge).
"""
