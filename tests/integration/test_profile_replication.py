"""The production profile's start check against the real broker: the local stack is one
broker with replication 1, so the check reads its topics' replicas and
min.insync.replicas (list_topics, describe_configs) and refuses, naming every topic;
a topic that does not exist is named missing; and CreateTopics with the production
replication on one broker fails loudly instead of making a weaker topic."""

from __future__ import annotations

import pytest

from streams.adapters.kafka import KafkaAdapterError, ensure_topics, topic_specs
from streams.adapters.kafka_replication import (
    ObservedTopic,
    TopicsBelowRequirement,
    observe,
    require_replication,
)
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS


def production(settings: Settings, **kafka: object) -> Settings:
    return Settings(profile="production", kafka={**settings.kafka.model_dump(), **kafka})


@pytest.mark.usefixtures("stack")
def test_the_single_broker_stack_is_refused_with_every_topic_named(settings: Settings) -> None:
    ensure_topics(settings.kafka)  # the local profile's topics: replication 1
    names = [s.name for s in topic_specs(settings.kafka)]
    seen = observe(settings.kafka, names, timeout_s=30)
    assert seen[settings.kafka.topic_prefix + ACCOUNT_EVENTS.name] == ObservedTopic(1, 1)
    assert set(seen) == set(names)

    with pytest.raises(TopicsBelowRequirement) as err:
        require_replication(production(settings).kafka)
    text = str(err.value)
    for name in names:
        assert f"{name}: replication factor 1, needs 3" in text
        assert f"{name}: min.insync.replicas 1, needs 2" in text


@pytest.mark.usefixtures("stack")
def test_missing_topics_are_named(settings: Settings, unique: str) -> None:
    kafka = production(settings, topic_prefix=f"absent-{unique}-").kafka
    with pytest.raises(TopicsBelowRequirement, match="missing"):
        require_replication(kafka)


@pytest.mark.usefixtures("stack")
def test_creating_production_topics_on_one_broker_fails_loudly(
    settings: Settings, unique: str
) -> None:
    kafka = production(settings, topic_prefix=f"rf3-{unique}-").kafka
    spec = next(s for s in topic_specs(kafka) if s.name.endswith(ACCOUNT_EVENTS.name))
    assert spec.replication_factor == 3
    with pytest.raises(KafkaAdapterError, match="creating topic"):
        ensure_topics(kafka, (spec,), timeout_s=20)
