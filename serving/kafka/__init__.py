"""Everything that talks Kafka, in one place (issue 41): the clients, the topic admin, the wire formats, the DLQ record.

=================  ==============================================================================================
module             what it holds
=================  ==============================================================================================
``codec``          the wire formats: JSON encoding, the ``produced-us`` stamp, :func:`decode_messages` (a poll's
                   messages → scorable frame, in-batch copies, dead letters)
``consumer``       the ingress consumer (manual commits, the rebalance listener) and the topic readers of the
                   tools (:func:`make_reader`, :func:`take`, :func:`watermarks`, :func:`assign_from`)
``producer``       every producer of the project (:func:`make_producer`) and its delivery check
                   (:func:`confirm_sent`)
``broker``         the topic admin (:func:`~fedfraud.serving.kafka.broker.create_topics`,
                   :func:`~fedfraud.serving.kafka.broker.wait_for_broker`) and the embedded Tansu broker
``dead_letters``   the one builder of DLQ records (masking, the payload digest)
=================  ==============================================================================================

The clients are librdkafka's (``confluent-kafka``); their factories apply
:class:`fedfraud.serving.config.ConsumerSettings` / :class:`fedfraud.serving.config.ProducerSettings` and the
deployment's :class:`fedfraud.serving.config.KafkaSecurity` and nothing else, so the same code talks to the
embedded broker and to a production cluster. The names below are the package's API; the poll loop that uses them
is :mod:`fedfraud.serving.consumer`, its poison handling :mod:`fedfraud.serving.poison`.
"""

from __future__ import annotations

from fedfraud.serving.kafka.codec import (
    PRODUCED_HEADER,
    DecodedBatch,
    content_hashes,
    decode_messages,
    ingress_validator,
    json_bytes,
    json_value,
    now_us,
    parse_json,
    produced_us_of,
)
from fedfraud.serving.kafka.consumer import (
    CommitFailed,
    IngressConsumer,
    Partition,
    Record,
    assign_from,
    caught_up,
    make_consumer,
    make_reader,
    take,
    wait_for_partitions,
    watermarks,
)
from fedfraud.serving.kafka.dead_letters import DeadLetter, dlq_headers, dlq_value
from fedfraud.serving.kafka.producer import Delivery, DeliveryError, Producer, confirm_sent, make_producer

__all__ = [
    "PRODUCED_HEADER",
    "CommitFailed",
    "DeadLetter",
    "DecodedBatch",
    "Delivery",
    "DeliveryError",
    "IngressConsumer",
    "Partition",
    "Producer",
    "Record",
    "assign_from",
    "caught_up",
    "confirm_sent",
    "content_hashes",
    "decode_messages",
    "dlq_headers",
    "dlq_value",
    "ingress_validator",
    "json_bytes",
    "json_value",
    "make_consumer",
    "make_producer",
    "make_reader",
    "now_us",
    "parse_json",
    "produced_us_of",
    "take",
    "wait_for_partitions",
    "watermarks",
]
