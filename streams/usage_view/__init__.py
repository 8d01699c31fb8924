"""The usage view (issue 13): usage to date and the upcoming invoice per customer.

* :mod:`~streams.usage_view.state` — the tables' values and how an event changes them (pure);
* :mod:`~streams.usage_view.preview` — the answer, rated by ``streams.domain.rating.rate`` (pure);
* :mod:`~streams.usage_view.price_book` — where the price book comes from (file / published);
* :mod:`~streams.usage_view.models` — the HTTP bodies (JSON Schema in ``schemas/http/``);
* :mod:`~streams.usage_view.app` — the faust-streaming app: tables, agent, routing, web;
* :mod:`~streams.usage_view.metrics` — Prometheus metrics (view and ingest edge).
"""
