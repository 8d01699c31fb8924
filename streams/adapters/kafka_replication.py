"""Do the topics on the broker have the replication the settings require?

Under ``profile = "production"`` (:class:`~streams.settings.Settings`) every long-running
process checks, before it reads or writes, that each registry topic exists with at
least the replication factor and ``min.insync.replicas`` the settings give it
(:meth:`~streams.settings.KafkaSettings.replication`: 3 and 2 by default), and refuses
to start otherwise (:class:`TopicsBelowRequirement`, naming each topic, what it has
and what it needs). ``invoicing topics create`` makes missing topics so; an existing
topic is never changed (raise its replication with Kafka's own tools).

What is read: the replicas of every partition (``list_topics`` metadata; the smallest
count is the topic's) and the topic's ``min.insync.replicas`` (``describe_configs``,
the effective value: the topic's own or the broker's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

from streams.adapters.kafka import KafkaAdapterError, admin_client, topic_specs
from streams.settings import KafkaSettings, TopicReplication


class TopicsBelowRequirement(KafkaAdapterError):
    """A topic is missing or has less replication than the settings require."""


@dataclass(frozen=True)
class ObservedTopic:
    """What the broker says of one topic: the fewest replicas of any partition, and its
    effective ``min.insync.replicas`` (None when the broker did not say)."""

    replicas: int
    min_insync_replicas: int | None


def replication_problems(
    required: Mapping[str, TopicReplication], observed: Mapping[str, ObservedTopic | None]
) -> list[str]:
    """One line per topic of ``required`` that is missing from ``observed`` (or None
    there) or has fewer replicas or a lower ``min.insync.replicas``; in name order."""
    problems: list[str] = []
    for name in sorted(required):
        need = required[name]
        seen = observed.get(name)
        if seen is None:
            problems.append(f"{name}: missing (invoicing topics create makes it)")
            continue
        if seen.replicas < need.replication_factor:
            problems.append(
                f"{name}: replication factor {seen.replicas}, needs {need.replication_factor}"
            )
        if seen.min_insync_replicas is None or seen.min_insync_replicas < need.min_insync_replicas:
            problems.append(
                f"{name}: min.insync.replicas {seen.min_insync_replicas}, needs "
                f"{need.min_insync_replicas}"
            )
    return problems


def observe(kafka: KafkaSettings, names: list[str], timeout_s: float) -> dict[str, ObservedTopic]:
    """The broker's view of the topics of ``names`` that exist.

    Raises:
        KafkaAdapterError: the broker did not answer within ``timeout_s``.
    """
    admin = admin_client(kafka)
    try:
        topics = admin.list_topics(timeout=timeout_s).topics
        present = [n for n in names if n in topics and topics[n].error is None]
        # describe_configs refuses an empty list (ValueError): no topic, nothing to ask
        futures = (
            admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, name) for name in present],
                request_timeout=timeout_s,
            )
            if present
            else {}
        )
        isr: dict[str, int | None] = {}
        for resource, future in futures.items():
            entry = future.result(timeout=timeout_s).get("min.insync.replicas")
            isr[resource.name] = int(entry.value) if entry is not None and entry.value else None
    except KafkaException as exc:
        raise KafkaAdapterError(f"reading the topics' replication failed: {exc}") from exc
    return {
        name: ObservedTopic(
            replicas=min((len(p.replicas) for p in topics[name].partitions.values()), default=0),
            min_insync_replicas=isr.get(name),
        )
        for name in present
    }


def require_replication(kafka: KafkaSettings, *, timeout_s: float = 30.0) -> None:
    """Refuse to go on unless every registry topic (under ``kafka.topic_prefix``) has the
    replication the settings require.

    Raises:
        TopicsBelowRequirement: one or more topics fall short (the message lists each).
        KafkaAdapterError: the broker did not answer.
    """
    specs = topic_specs(kafka)
    required = {s.name: kafka.replication(s.name.removeprefix(kafka.topic_prefix)) for s in specs}
    problems = replication_problems(required, observe(kafka, list(required), timeout_s))
    if problems:
        raise TopicsBelowRequirement(
            f"refusing to start under profile {kafka.profile}: "
            + "; ".join(problems)
            + " (docs/configuration.md, kafka.replication_factor)"
        )
