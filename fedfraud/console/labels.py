"""The analyst's verdict: one ``fraud-labels`` record, the same path chargebacks take, and one audit line.

The record is :func:`fedfraud.serving.labels.label_message` with ``source: analyst:<user>``, keyed by the
transaction id as the replay tool's chargebacks are, and produced by :func:`fedfraud.serving.kafka.make_producer`
(every producer of the project): the bank's :class:`fedfraud.serving.labels.LabelJoiner` writes it to the outcome
store and the retraining cycle reads it from there like any other label. The audit line is appended only after
the broker acknowledged the record (its partition and offset are in it); a failed send is audited too.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fedfraud.core.errors import UserError
from fedfraud.serving.config import KafkaSecurity, ProducerSettings, TopicNames
from fedfraud.serving.kafka import DeliveryError, confirm_sent, make_producer
from fedfraud.serving.labels import LABELS, label_message

__all__ = ["ANALYST_NAME", "LabelWriter", "Labelled", "valid_analyst"]

log = logging.getLogger(__name__)

#: An analyst's name as it goes into ``source: analyst:<name>`` (the joiner keeps 64 characters of a source).
ANALYST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,47}")


def valid_analyst(name: str) -> bool:
    """Whether ``name`` may be an analyst's name (letters, digits, ``._@-``; at most 48 characters)."""
    return ANALYST_NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Labelled:
    """A label the broker acknowledged: where it landed."""

    transaction_id: str
    label: str
    source: str
    partition: int
    offset: int
    labelled_at: str


class LabelWriter:
    """Produces analysts' labels and appends every attempt to a JSON-lines audit log (thread-safe)."""

    def __init__(self, bootstrap_servers: str, audit_log: Path, topics: TopicNames | None = None,
                 producer: ProducerSettings | None = None, security: KafkaSecurity | None = None) -> None:
        self.topics = topics or TopicNames()
        self.audit_log = Path(audit_log)
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        self._producer = make_producer(bootstrap_servers, producer or ProducerSettings(), client_id="fedfraud-console",
                                       security=security)
        self._lock = threading.Lock()

    def label(self, transaction_id: str, label: str, analyst: str) -> Labelled:
        """Produce the verdict and wait for the broker's ack; :class:`UserError` for a bad label or name,
        :class:`DeliveryError` when the broker did not take it (audited either way).
        """
        if label not in LABELS:
            raise UserError(f"label must be one of {sorted(LABELS)}")
        if not valid_analyst(analyst):
            raise UserError("analyst name: letters, digits and ._@- only, at most 48 characters")
        source = f"analyst:{analyst}"
        at = datetime.now(UTC).isoformat(timespec="seconds")
        value = label_message(transaction_id, LABELS[label], at, source)
        with self._lock:
            future = self._producer.send(self.topics.labels, key=transaction_id.encode(), value=value)
            try:
                confirm_sent(self._producer, [future])
            except DeliveryError as exc:
                self._audit({"at": at, "actor": source, "action": "label", "transaction_id": transaction_id,
                             "label": label, "topic": self.topics.labels, "result": f"failed: {exc}"})
                raise
            done = Labelled(transaction_id, label, source, future.partition, future.offset, at)
            self._audit({"at": at, "actor": source, "action": "label", "transaction_id": transaction_id,
                         "label": label, "topic": self.topics.labels, "partition": done.partition,
                         "offset": done.offset, "result": "acknowledged"})
        log.info("analyst label transaction=%s label=%s by %s at %s[%d]@%d", transaction_id, label, source,
                 self.topics.labels, done.partition, done.offset)
        return done

    def _audit(self, entry: dict[str, object]) -> None:
        with self.audit_log.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")

    def close(self) -> None:
        self._producer.close(timeout=5)
