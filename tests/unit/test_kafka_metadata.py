"""Generation parsing (``parse_group_metadata``) and the refusal of static membership.

The byte strings below were captured from ``Consumer.consumer_group_metadata()``
(confluent-kafka / librdkafka 2.16.0) against the project's Kafka 4.3 broker on
2026-11-29, before and after joining a group, without and with ``group.instance.id``.
The generation is the fencing token's first half (docs/design.md "Ownership and fencing"):
a parser that reads it wrong fences the wrong writer, so these are pinned exactly.
"""

from __future__ import annotations

import struct

import pytest

from streams.adapters.kafka import (
    ConfigurationError,
    GroupMetadataFormatError,
    consumer_config,
    parse_group_metadata,
)
from streams.settings import KafkaSettings

MEMBER = b"rdkafka-261e86af-b8e6-4f81-a0fa-63096aea7f86"
BEFORE_JOIN = b"CGMDv2:\xff\xff\xff\xffcgmd-probe-7e5ac8\x00\x00\x01"
AFTER_JOIN = b"CGMDv2:\x01\x00\x00\x00cgmd-probe-7e5ac8\x00" + MEMBER + b"\x00\x01"
STATIC_AFTER_JOIN = (
    b"CGMDv2:\x01\x00\x00\x00cgmd-probe-dea3ff\x00"
    b"static-1-b5f81bb8-2865-4a0d-9387-ad045da45143\x00\x00static-1\x00"
)


def test_observed_bytes_after_joining() -> None:
    meta = parse_group_metadata(AFTER_JOIN, byteorder="little")
    assert meta.generation_id == 1
    assert meta.group_id == "cgmd-probe-7e5ac8"
    assert meta.member_id == MEMBER.decode()
    assert meta.group_instance_id is None


def test_observed_bytes_before_joining() -> None:
    meta = parse_group_metadata(BEFORE_JOIN, byteorder="little")
    assert (meta.generation_id, meta.member_id, meta.group_instance_id) == (-1, "", None)


def test_observed_static_member_exposes_its_instance_id() -> None:
    meta = parse_group_metadata(STATIC_AFTER_JOIN, byteorder="little")
    assert meta.generation_id == 1
    assert meta.group_instance_id == "static-1"
    assert meta.member_id.startswith("static-1-")


@pytest.mark.parametrize("generation", [0, 2, 255, 256, 70_000, 2**31 - 1])
def test_generation_in_host_byte_order(generation: int) -> None:
    for order, fmt in (("little", "<i"), ("big", ">i")):
        raw = b"CGMDv2:" + struct.pack(fmt, generation) + b"g\x00m\x00\x01"
        assert parse_group_metadata(raw, byteorder=order).generation_id == generation


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"CGMDv3:\x01\x00\x00\x00g\x00m\x00\x01", "magic"),  # a future librdkafka format
        (b"CGMD:\x01\x00\x00\x00g\x00m\x00\x01", "magic"),
        (b"", "magic"),
        (b"CGMDv2:\x01\x00", "truncated"),
        (b"CGMDv2:\x01\x00\x00\x00g-without-nul", "NUL"),
        (b"CGMDv2:\x01\x00\x00\x00g\x00m-without-nul", "NUL"),
        (b"CGMDv2:\x01\x00\x00\x00g\x00m\x00", "instance id"),  # flag byte missing
        (b"CGMDv2:\x01\x00\x00\x00g\x00m\x00\x02", "instance id"),
        (b"CGMDv2:\x01\x00\x00\x00g\x00m\x00\x00static", "instance id"),
        (b"CGMDv2:\x01\x00\x00\x00\xff\x00m\x00\x01", "UTF-8"),
    ],
)
def test_refused_bytes(raw: bytes, says: str) -> None:
    with pytest.raises(GroupMetadataFormatError, match=says):
        parse_group_metadata(raw, byteorder="little")


def test_refuses_a_non_bytes_value() -> None:
    with pytest.raises(GroupMetadataFormatError, match="expected bytes"):
        parse_group_metadata("CGMDv2:", byteorder="little")  # type: ignore[arg-type]


def test_static_membership_is_refused() -> None:
    kafka = KafkaSettings()
    with pytest.raises(ConfigurationError, match="static membership"):
        consumer_config(kafka, "g", **{"group.instance.id": "worker-1"})


def test_consumer_config_is_cooperative_sticky_without_auto_commit() -> None:
    config = consumer_config(KafkaSettings(group_protocol="classic"), "g")
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert config["enable.auto.commit"] is False
    assert config["enable.auto.offset.store"] is False
    assert "group.instance.id" not in config
