"""Kafka adapter: client configurations, topic creation, and group metadata parsing.

Everything that knows librdkafka's configuration names lives here, so the rest
of the code asks for "a producer" or "a consumer of group X" and gets the
project's guarantees with it:

- producers: ``partitioner=murmur2_random`` (the Java client's default
  partitioner, so Python and Java producers put a customer on the same
  partition), idempotence on, ``acks=all``;
- consumers: auto-commit **off** and offset auto-store off (offsets are
  committed only after the database commit, see
  :class:`streams.core.billing.commit.CommitPoint`), cooperative-sticky
  assignment, no static membership (``group.instance.id`` is refused: it would
  let a replacement process reuse a generation, docs/design.md "Ownership and fencing").
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol, SupportsBytes

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.core.billing.rows import Record
from streams.errors import InvoicingError
from streams.settings import KafkaSettings
from streams.topics import OUTBOX_HEARTBEAT, REGISTRY, TopicSpec

log = logging.getLogger(__name__)


class KafkaAdapterError(InvoicingError):
    """Root of this adapter's errors."""


class ConfigurationError(KafkaAdapterError):
    """A client configuration the pipeline refuses (e.g. static membership)."""


class GroupMetadataFormatError(KafkaAdapterError):
    """``consumer_group_metadata()`` returned bytes we do not understand."""


def security_config(kafka: KafkaSettings) -> dict[str, Any]:
    """librdkafka's security keys of ``kafka`` (docs/production.md "TLS and
    authentication"): nothing under PLAINTEXT; ``security.protocol``, the CA
    (``ssl.ca.location``), the mTLS certificate and key, and under SASL_SSL the
    mechanism and login. Every client config below starts from these. The password is
    in the returned dict: pass it to a client, never log it."""
    if kafka.security_protocol == "PLAINTEXT":
        return {}
    config: dict[str, Any] = {"security.protocol": kafka.security_protocol}
    if kafka.ssl_ca_file is not None:
        config["ssl.ca.location"] = str(kafka.ssl_ca_file)
    if kafka.ssl_cert_file is not None and kafka.ssl_key_file is not None:
        config["ssl.certificate.location"] = str(kafka.ssl_cert_file)
        config["ssl.key.location"] = str(kafka.ssl_key_file)
    if kafka.security_protocol == "SASL_SSL":
        config["sasl.mechanism"] = kafka.sasl_mechanism
        config["sasl.username"] = kafka.sasl_username
        config["sasl.password"] = (
            kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
        )
    return config


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context of ``kafka``: the CA (``ssl_ca_file``, else the system's),
    host names checked, the mTLS certificate and key when set (for aiokafka)."""
    context = ssl.create_default_context(
        cafile=str(kafka.ssl_ca_file) if kafka.ssl_ca_file else None
    )
    if kafka.ssl_cert_file is not None and kafka.ssl_key_file is not None:
        context.load_cert_chain(str(kafka.ssl_cert_file), str(kafka.ssl_key_file))
    return context


def faust_credentials(kafka: KafkaSettings) -> Any:
    """faust's ``broker_credentials`` of ``kafka`` (the usage view, aiokafka underneath):
    None under PLAINTEXT, ``SSLCredentials`` under SSL, ``SASLCredentials`` with the
    mechanism and a TLS context under SASL_SSL."""
    if kafka.security_protocol == "PLAINTEXT":
        return None
    import faust

    if kafka.security_protocol == "SSL":
        return faust.SSLCredentials(ssl_context(kafka))
    return faust.SASLCredentials(
        username=kafka.sasl_username,
        password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
        ssl_context=ssl_context(kafka),
        mechanism=kafka.sasl_mechanism,
    )


def producer_config(kafka: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """librdkafka producer configuration with the project's guarantees."""
    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        **security_config(kafka),
        # The Java client's partitioner: murmur2 of the key bytes, positive, mod partitions.
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "compression.type": "lz4",
        "message.timeout.ms": 120_000,
    }
    config.update(overrides)
    return config


def consumer_config(kafka: KafkaSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka consumer configuration for a member of ``group_id``.

    Raises:
        ConfigurationError: ``group.instance.id`` (static membership) was asked for.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        **security_config(kafka),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "max.poll.interval.ms": kafka.max_poll_interval_ms,
        "isolation.level": "read_committed",
        # A partition resumed after an invoice job joins the *next* fetch request; with
        # the default 500 ms broker wait an idle fetch delays every marker behind it.
        "fetch.wait.max.ms": 50,
    }
    if kafka.group_protocol == "consumer":
        # KIP-848: the broker assigns; session/heartbeat/assignor are broker-side settings.
        config["group.protocol"] = "consumer"
    else:
        config["group.protocol"] = "classic"
        config["partition.assignment.strategy"] = "cooperative-sticky"
        config["session.timeout.ms"] = kafka.session_timeout_ms
        config["heartbeat.interval.ms"] = kafka.heartbeat_interval_ms
    config.update(overrides)
    if config.get("group.instance.id"):
        raise ConfigurationError(
            "static membership (group.instance.id) is not allowed: a replacement process "
            "would reuse the generation its fencing token comes from"
        )
    return config


def reader_config(kafka: KafkaSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka configuration of a consumer that never joins ``group_id``: it reads the
    group's committed offsets and the watermarks, or partitions it assigns itself, and
    commits nothing (auto-commit off; nothing here calls ``commit``)."""
    config: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        **security_config(kafka),
        "group.id": group_id,
        "enable.auto.commit": False,
    }
    config.update(overrides)
    return config


def make_producer(kafka: KafkaSettings, **overrides: Any) -> Producer:
    return Producer(producer_config(kafka, **overrides))


def make_consumer(kafka: KafkaSettings, group_id: str, **overrides: Any) -> Consumer:
    return Consumer(consumer_config(kafka, group_id, **overrides))


def make_reader(kafka: KafkaSettings, group_id: str, **overrides: Any) -> Consumer:
    return Consumer(reader_config(kafka, group_id, **overrides))


def admin_client(kafka: KafkaSettings) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap_servers, **security_config(kafka)})


def replicated(spec: TopicSpec, kafka: KafkaSettings) -> TopicSpec:
    """``spec`` with the replication the settings give its topic
    (:meth:`~streams.settings.KafkaSettings.replication`): the replication factor, and
    ``min.insync.replicas`` in its configuration."""
    replication = kafka.replication(spec.name)
    return dataclasses.replace(
        spec,
        replication_factor=replication.replication_factor,
        extra_config={
            **spec.extra_config,
            "min.insync.replicas": str(replication.min_insync_replicas),
        },
    )


def topic_specs(kafka: KafkaSettings) -> tuple[TopicSpec, ...]:
    """The registry's topics and the outbox connector's heartbeat topic
    (:data:`~streams.topics.OUTBOX_HEARTBEAT`) under ``kafka.topic_prefix``, with their
    replication."""
    return tuple(
        replicated(spec, kafka).with_prefix(kafka.topic_prefix)
        for spec in (*REGISTRY, OUTBOX_HEARTBEAT)
    )


def ensure_topics(
    kafka: KafkaSettings, specs: tuple[TopicSpec, ...] | None = None, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics of ``specs`` (default: the registry) that do not exist.

    Idempotent: existing topics are left alone. Returns the names created, once the
    broker's metadata shows a leader for each of their partitions: CreateTopics
    answers before leadership has propagated, and a client that asks for offsets in
    between gets ``NOT_LEADER_FOR_PARTITION`` (seen right after creation).

    Raises:
        KafkaAdapterError: a creation failed for another reason than "exists", or a
            created topic had no leader for every partition within ``timeout_s``.
    """
    specs = specs if specs is not None else topic_specs(kafka)
    admin = admin_client(kafka)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [s for s in specs if s.name not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(
                s.name,
                num_partitions=s.partitions,
                replication_factor=s.replication_factor,
                config=s.config(),
            )
            for s in wanted
        ],
        request_timeout=timeout_s,
    )
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            if err.name() != "TOPIC_ALREADY_EXISTS":
                raise KafkaAdapterError(f"creating topic {name} failed: {err}") from exc
    _wait_for_leaders(admin, {s.name: s.partitions for s in wanted}, timeout_s)
    return created


def _wait_for_leaders(admin: AdminClient, partitions: dict[str, int], timeout_s: float) -> None:
    """Poll topic metadata until each topic has ``partitions[name]`` partitions, each
    with a leader and no error.

    Raises:
        KafkaAdapterError: not so within ``timeout_s`` (names the topics still waiting).
    """
    deadline = time.monotonic() + timeout_s
    waiting = dict(partitions)
    while waiting:
        topics = admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        for name, count in list(waiting.items()):
            meta = topics.get(name)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == count
                and all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
            ):
                del waiting[name]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise KafkaAdapterError(f"no leader for every partition of {sorted(waiting)} yet")
        time.sleep(0.1)


#: Errors a ListOffsets request answers while a partition's leadership is settling
#: (right after topic creation, or while a broker restarts): retriable, and gone once
#: the client's metadata and the broker agree on the leader and its epoch (KIP-320).
LEADERSHIP_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
    }
)

#: How long :func:`offsets_for_times` asks again while leadership settles (seconds).
OFFSETS_SETTLE_S = 15.0


def _settling(error: object) -> bool:
    return isinstance(error, KafkaError) and error.code() in LEADERSHIP_SETTLING


def offsets_for_times(
    consumer: Consumer,
    wanted: list[TopicPartition],
    *,
    settle_s: float = OFFSETS_SETTLE_S,
    timeout_s: float = 10.0,
) -> list[TopicPartition]:
    """``consumer.offsets_for_times(wanted)``, asked again every 0.2 s for up to
    ``settle_s`` seconds while the whole request, or any partition in its answer, fails
    with a :data:`LEADERSHIP_SETTLING` error.

    Seen on a topic created a moment before: its metadata already names a leader, and
    ListOffsets still answers ``NOT_LEADER_FOR_PARTITION`` for the whole request, or
    ``UNKNOWN_LEADER_EPOCH`` ("leader epoch is newer than broker epoch") for one
    partition of the answer.

    Returns:
        The answer, one :class:`TopicPartition` per wanted partition with ``offset``
        (``-1``: no record at or after the time). After ``settle_s`` the last answer is
        returned as it is: a partition may still carry its ``error``, for the caller to
        report.

    Raises:
        KafkaException: the request failed with another error, or still failed with a
            settling one after ``settle_s``.
    """
    deadline = time.monotonic() + settle_s
    while True:
        try:
            found: list[TopicPartition] = consumer.offsets_for_times(wanted, timeout=timeout_s)
        except KafkaException as exc:
            if not _settling(exc.args[0] if exc.args else None) or time.monotonic() > deadline:
                raise
            log.info("offsets_for_times: %s; asking again", exc)
        else:
            settling = [tp for tp in found if _settling(tp.error)]
            if not settling or time.monotonic() > deadline:
                return found
            log.info(
                "offsets_for_times: %s[%s] %s; asking again",
                settling[0].topic,
                settling[0].partition,
                settling[0].error,
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------- group metadata


_CGMD_MAGIC = b"CGMDv2:"


@dataclass(frozen=True)
class GroupMetadata:
    """librdkafka's consumer group metadata: the fencing token's ingredients.

    ``generation_id`` is the group generation (classic protocol) or the member
    epoch (KIP-848 ``group.protocol=consumer``); both only grow.
    """

    generation_id: int
    group_id: str
    member_id: str
    group_instance_id: str | None


def parse_group_metadata(raw: bytes, *, byteorder: str = sys.byteorder) -> GroupMetadata:
    """Parse the bytes of ``Consumer.consumer_group_metadata()``.

    Format (librdkafka ``rd_kafka_consumer_group_metadata_write``; private to
    librdkafka, hence this one guarded function), as measured against
    librdkafka 2.16.0 and a Kafka 4.3 broker::

        b"CGMDv2:"                 ASCII magic
        int32                      generation id, host byte order (memcpy); -1 before joining
        group_id   b"\\0"          NUL-terminated
        member_id  b"\\0"          NUL-terminated ("" before joining)
        b"\\x01"                   no group instance id, or
        b"\\x00" instance_id b"\\0"  static membership's group.instance.id

    Observed: ``CGMDv2:\\x01\\x00\\x00\\x00<group>\\x00rdkafka-<uuid>\\x00\\x01`` at generation 1.

    Raises:
        GroupMetadataFormatError: another magic, truncated or malformed bytes.
    """
    if not isinstance(raw, bytes | bytearray):
        raise GroupMetadataFormatError(f"expected bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if not raw.startswith(_CGMD_MAGIC):
        raise GroupMetadataFormatError(
            f"unknown consumer group metadata magic {raw[:7]!r} (expected {_CGMD_MAGIC!r}); "
            "librdkafka changed its private format: update parse_group_metadata"
        )
    body = raw[len(_CGMD_MAGIC) :]
    if len(body) < 4:
        raise GroupMetadataFormatError("consumer group metadata truncated before the generation id")
    fmt = "<i" if byteorder == "little" else ">i"
    (generation,) = struct.unpack(fmt, body[:4])
    rest = body[4:]
    try:
        group_end = rest.index(b"\x00")
        member_end = rest.index(b"\x00", group_end + 1)
    except ValueError:
        raise GroupMetadataFormatError(
            "consumer group metadata lacks a NUL-terminated group or member id"
        ) from None
    flags = rest[member_end + 1 :]
    if flags == b"\x01":
        instance: str | None = None
    elif flags.startswith(b"\x00") and flags.endswith(b"\x00") and len(flags) >= 2:
        instance = flags[1:-1].decode("utf-8", errors="strict")
    else:
        raise GroupMetadataFormatError(f"unexpected group instance id field {flags!r}")
    try:
        group_id = rest[:group_end].decode()
        member_id = rest[group_end + 1 : member_end].decode()
    except UnicodeDecodeError as exc:
        raise GroupMetadataFormatError("consumer group metadata strings are not UTF-8") from exc
    return GroupMetadata(generation, group_id, member_id, instance or None)


class HasGroupMetadata(Protocol):
    """A consumer-group member (``confluent_kafka.Consumer``, or any
    :class:`~streams.core.billing.ports.KafkaSource`)."""

    def consumer_group_metadata(self) -> SupportsBytes: ...


def group_metadata(consumer: HasGroupMetadata) -> GroupMetadata:
    """The consumer's current group metadata (generation, member id)."""
    cgmd = consumer.consumer_group_metadata()
    raw = bytes(cgmd)
    return parse_group_metadata(raw)


# --------------------------------------------------------------------------- records


def record_of(msg: Message) -> Record:
    """Convert a consumed (non-error) ``Message``. Its headers are the consumer's own list
    when every value is bytes (not copied: nothing mutates a record's headers), else a
    copy with text encoded as UTF-8 and None as b"".

    Raises:
        KafkaAdapterError: the message carries an error or no coordinates.
    """
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if msg.error() is not None or topic is None or partition is None or offset is None:
        raise KafkaAdapterError(f"not a consumed record: {msg.error()}")
    raw_headers = msg.headers() or []
    # checked below: a list whose values are all bytes
    headers: list[tuple[str, bytes]] = raw_headers  # type: ignore[assignment]
    if raw_headers.__class__ is not list:
        headers = _plain_headers(raw_headers)
    else:
        # the consumer's own list (bytes values) is kept as it is: copying every record's
        # headers was most of this function's cost (docs/benchmarks.md, "Ingest: `record_of`
        # without the header copy"); a None or text value makes the copy
        for pair in raw_headers:
            if pair[1].__class__ is not bytes:
                headers = _plain_headers(raw_headers)
                break
    key, value = msg.key(), msg.value()
    ts_type, ts = msg.timestamp()
    return Record(
        topic,
        partition,
        offset,
        key.encode() if isinstance(key, str) else key,
        value.encode() if isinstance(value, str) else value,
        headers,
        ts if ts_type else None,
    )


def _plain_headers(raw: Any) -> list[tuple[str, bytes]]:
    """``raw`` (a list of pairs or a dict, values bytes, text or None) as a new list of
    ``(name, bytes)``; None becomes b""."""
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [
        (name, value.encode() if isinstance(value, str) else (value or b""))
        for name, value in pairs
    ]
