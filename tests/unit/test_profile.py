"""The production profile: replication 3 and min.insync.replicas 2 by default and as a
floor, per-topic overrides, topics created and checked with them, every long-running
process refusing to start against topics that fall short, and no fault injection."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from streams.adapters import kafka_replication
from streams.adapters.kafka import topic_specs
from streams.adapters.kafka_replication import (
    ObservedTopic,
    TopicsBelowRequirement,
    replication_problems,
    require_replication,
)
from streams.apps.usage_view.app import changelog_topics
from streams.bootstrap import require_profile
from streams.bootstrap.view import view_config
from streams.entrypoints.app import app
from streams.settings import KafkaSettings, Settings, TopicReplication
from streams.topics import OUTBOX_HEARTBEAT, REGISTRY


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("INVOICING_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_local_profile_keeps_replication_one(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.profile == "local" and settings.kafka.profile == "local"
    for spec in topic_specs(settings.kafka):
        assert spec.replication_factor == 1
        assert spec.config()["min.insync.replicas"] == "1"
    # fault injection is allowed for the chaos tests
    clean_env.setenv("INVOICING_FAULT__KILL_AFTER_DB_COMMIT", "1")
    assert Settings().fault.kill_after_db_commit


def test_production_profile_defaults_to_three_and_two(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("INVOICING_PROFILE", "production")
    settings = Settings()
    specs = topic_specs(settings.kafka)
    assert {s.name for s in specs} == {s.name for s in (*REGISTRY, OUTBOX_HEARTBEAT)}
    for spec in specs:
        assert spec.replication_factor == 3
        assert spec.config()["min.insync.replicas"] == "2"
    view = view_config(settings)
    for spec in changelog_topics(view):
        assert spec.replication_factor == 3
        assert spec.config()["min.insync.replicas"] == "2"
    assert view.replication_factor == 3


def test_per_topic_replication(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("INVOICING_PROFILE", "production")
    clean_env.setenv(
        "INVOICING_KAFKA__TOPIC_REPLICATION",
        '{"billing.invoices.v1": {"replication_factor": 5, "min_insync_replicas": 3}}',
    )
    clean_env.setenv("INVOICING_KAFKA__TOPIC_PREFIX", "t-")
    specs = {s.name: s for s in topic_specs(Settings().kafka)}
    assert specs["t-billing.invoices.v1"].replication_factor == 5
    assert specs["t-billing.invoices.v1"].config()["min.insync.replicas"] == "3"
    assert specs["t-billing.account-events.v1"].replication_factor == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {
                "INVOICING_KAFKA__REPLICATION_FACTOR": "2",
                "INVOICING_KAFKA__MIN_INSYNC_REPLICAS": "2",
            },
            "replication_factor >= 3",
        ),
        ({"INVOICING_KAFKA__REPLICATION_FACTOR": "1"}, "exceeds replication_factor 1"),
        ({"INVOICING_KAFKA__MIN_INSYNC_REPLICAS": "1"}, "min_insync_replicas >= 2"),
        (
            {
                "INVOICING_KAFKA__TOPIC_REPLICATION": (
                    '{"billing.price-book.v1": {"replication_factor": 2, "min_insync_replicas": 2}}'
                )
            },
            "topic billing.price-book.v1 has 2 and 2",
        ),
        ({"INVOICING_FAULT__KILL_AFTER_DB_COMMIT": "1"}, "fault injection"),
        ({"INVOICING_FAULT__KILL_REPLAY_AFTER_WRITES": "3"}, "unavailable under profile"),
    ],
)
def test_production_refuses_what_breaks_its_rules(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    clean_env.setenv("INVOICING_PROFILE", "production")
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ValidationError, match=message):
        Settings()


def test_min_insync_above_replication_is_refused_in_any_profile() -> None:
    with pytest.raises(ValidationError, match="exceeds replication_factor"):
        TopicReplication(replication_factor=2, min_insync_replicas=3)


def test_replication_problems_names_each_shortfall() -> None:
    need = TopicReplication(replication_factor=3, min_insync_replicas=2)
    required = {"a": need, "b": need, "c": need, "d": need, "e": need}
    observed = {
        "a": ObservedTopic(3, 2),
        "b": ObservedTopic(1, 2),
        "c": ObservedTopic(3, 1),
        "d": ObservedTopic(3, None),
    }
    assert replication_problems(required, observed) == [
        "b: replication factor 1, needs 3",
        "c: min.insync.replicas 1, needs 2",
        "d: min.insync.replicas None, needs 2",
        "e: missing (invoicing topics create makes it)",
    ]
    assert replication_problems({"a": need}, {"a": ObservedTopic(5, 3)}) == []


def _production_kafka(clean_env: pytest.MonkeyPatch) -> KafkaSettings:
    clean_env.setenv("INVOICING_PROFILE", "production")
    return Settings().kafka


def test_require_replication_refuses_with_a_clear_message(
    clean_env: pytest.MonkeyPatch,
) -> None:
    kafka = _production_kafka(clean_env)
    names = [s.name for s in topic_specs(kafka)]
    observed = {n: ObservedTopic(1, 1) for n in names}
    clean_env.setattr(kafka_replication, "observe", lambda *_a, **_k: observed)
    with pytest.raises(TopicsBelowRequirement) as err:
        require_replication(kafka)
    text = str(err.value)
    assert text.startswith("refusing to start under profile production: ")
    for name in names:
        assert f"{name}: replication factor 1, needs 3" in text
        assert f"{name}: min.insync.replicas 1, needs 2" in text
    good = {n: ObservedTopic(3, 2) for n in names}
    clean_env.setattr(kafka_replication, "observe", lambda *_a, **_k: good)
    require_replication(kafka)


def test_require_profile_checks_only_in_production(clean_env: pytest.MonkeyPatch) -> None:
    def broker_down(*_a: object, **_k: object) -> dict[str, ObservedTopic]:
        raise AssertionError("the local profile must not ask the broker")

    clean_env.setattr(kafka_replication, "observe", broker_down)
    require_profile(Settings())
    clean_env.setenv("INVOICING_PROFILE", "production")
    clean_env.setattr(kafka_replication, "observe", lambda *_a, **_k: {})
    with pytest.raises(TopicsBelowRequirement, match="missing"):
        require_profile(Settings())


@pytest.mark.parametrize(
    "command",
    [["worker", "invoicing"], ["worker", "email"], ["worker", "ingest"], ["worker", "usage-view"]],
)
def test_every_long_running_process_refuses_to_start(
    clean_env: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Exit 2 and the message, before any client is built (the broker is not reached:
    the check's read is replaced by topics of replication 1)."""
    clean_env.setenv("INVOICING_PROFILE", "production")
    clean_env.setattr(
        kafka_replication,
        "observe",
        lambda kafka, names, timeout_s: {n: ObservedTopic(1, 1) for n in names},
    )
    import signal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = CliRunner().invoke(app, command)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert result.exit_code == 2, result.output
    assert "refusing to start under profile production" in result.output
    assert "replication factor 1, needs 3" in result.output
