"""Reading a topic of the embedded broker to its end, for tests: what a test's messages produced is there once the
scorer or joiner accounted for them, so a test reads to the end instead of waiting a fixed time for stragglers."""

from __future__ import annotations

import time
from collections.abc import Callable


def topic_messages(servers: str, topic: str, start: dict[int, int] | None = None,
                   until: Callable[[list[tuple]], bool] = lambda messages: True) -> list[tuple]:
    """``(key, value, headers)`` of every message of ``topic`` from ``start`` (else its beginning) to its end,
    and on until ``until`` holds for them. Tansu's end offset is its last batch's first offset plus one, so what
    the last fetch queued behind it is taken too."""
    from fedfraud.serving.kafka.consumer import assign_from, caught_up, make_reader, take, watermarks

    consumer = make_reader(servers, client_id="fedfraud-test")
    try:
        meta = consumer.list_topics(timeout=10).topics.get(topic)
        parts = [(topic, p) for p in sorted(meta.partitions if meta is not None and meta.error is None else ())]
        if not parts:
            return []
        end = watermarks(consumer, parts)
        positions = {part: (start or {}).get(part[1], end[part][0]) for part in parts}
        assign_from(consumer, positions)
        out: list[tuple] = []

        def read(timeout_ms: int) -> int:
            got = take(consumer, timeout_ms, 5000)
            for m in got:
                out.append((m.key, m.value or b"", [(k, v or b"") for k, v in (m.headers or [])]))
                positions[(m.topic, m.partition)] = m.offset + 1
            return len(got)

        deadline = time.monotonic() + 60
        while True:
            if caught_up(positions, end):
                while read(0):
                    pass
                if until(out):
                    return out
            assert time.monotonic() < deadline, f"{topic}: not read to its end (or not all that was awaited)"
            read(200)
    finally:
        consumer.close()


def topic_records(servers: str, topic: str, start: dict[int, int],
                  until: Callable[[list[dict]], bool]) -> list[dict]:
    """The JSON records of ``topic`` from ``start`` to its end, read on until ``until`` holds for them: once the
    group accounted for what a test sent, its outputs are on their topics (the counters never run ahead of the
    broker's acknowledgement), so reading to the end replaces waiting a fixed time for stragglers."""
    import json

    def parsed(messages: list[tuple]) -> list[dict]:
        return [json.loads(value) for _, value, _ in messages]

    return parsed(topic_messages(servers, topic, start, until=lambda messages: until(parsed(messages))))
