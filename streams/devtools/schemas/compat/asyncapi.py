"""The AsyncAPI rules of the compatibility check: a topic's partitions, cleanup, retention.

Per-customer order and "read from the beginning" are part of a topic's contract, so for
every topic present in both ``asyncapi.yaml`` documents a changed partition count, a
changed cleanup policy or a lowered retention is breaking (:func:`channel_changes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from streams.devtools.schemas.compat.findings import CompatError, Incompatibility


def load_asyncapi(text: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CompatError(f"asyncapi.yaml is not YAML: {exc}") from exc
    return document if isinstance(document, dict) else {}


def channel_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Incompatibility]:
    """Partition count, cleanup policy and retention of topics present in both documents."""

    def bindings(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        result: dict[str, Mapping[str, Any]] = {}
        for channel in (doc.get("channels") or {}).values():
            if isinstance(channel, Mapping) and isinstance(channel.get("address"), str):
                kafka = (channel.get("bindings") or {}).get("kafka") or {}
                result[channel["address"]] = kafka
        return result

    before, after = bindings(old), bindings(new)
    problems: list[Incompatibility] = []
    for topic in sorted(set(before) & set(after)):
        was, now = before[topic], after[topic]
        if was.get("partitions") != now.get("partitions"):
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"partition count changed from {was.get('partitions')} to "
                    f"{now.get('partitions')} (moves customers to other partitions: "
                    "per-customer order breaks across the change)",
                )
            )
        config_was = was.get("topicConfiguration") or {}
        config_now = now.get("topicConfiguration") or {}
        if config_was.get("cleanup.policy") != config_now.get("cleanup.policy"):
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"cleanup.policy changed from {config_was.get('cleanup.policy')} to "
                    f"{config_now.get('cleanup.policy')}",
                )
            )
        retention_was = _retention(config_was.get("retention.ms"))
        retention_now = _retention(config_now.get("retention.ms"))
        if retention_now < retention_was:
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"retention.ms lowered from {config_was.get('retention.ms')} to "
                    f"{config_now.get('retention.ms')} (subscribers may no longer start from "
                    "the beginning)",
                )
            )
    return problems


def _retention(value: Any) -> float:
    if value is None or value == -1:
        return float("inf")
    return float(value)
