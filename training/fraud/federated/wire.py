"""A recording TCP proxy between one bank's XGBoost worker and the federated server, and a decoder of what
it recorded: the evidence behind "what leaves a bank" (docs/fraud.md), used by the tests.

The worker talks gRPC (HTTP/2, plaintext here; in production it is TLS and
this proxy could not read it). The decoder walks the HTTP/2 frames of the
bank → server direction, joins each stream's DATA frames, strips the gRPC
5-byte prefix and reads the protobuf request fields of xgboost's
``federated.proto`` (``sequence_number`` 1, ``rank`` 2, ``send_buffer`` 3,
``data_type`` 4, ``reduce_operation`` 5 / ``root`` 4). Every byte the bank
contributes to a collective operation is in some ``send_buffer``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedfraud.core.tcpproxy import TcpProxy

__all__ = ["RecordingProxy", "WireMessage", "decode_grpc_requests"]

logger = logging.getLogger(__name__)

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(frozen=True)
class WireMessage:
    """One gRPC request of a bank to the server: its protobuf fields (varints as ints, bytes as bytes)."""

    stream: int
    fields: dict[int, int | bytes]

    @property
    def send_buffer(self) -> bytes:
        value = self.fields.get(3, b"")
        return value if isinstance(value, bytes) else b""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _protobuf_fields(data: bytes) -> dict[int, int | bytes]:
    fields: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            fields[number] = data[pos:pos + size]
            pos += size
        elif wire == 1:
            fields[number] = int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            fields[number] = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return fields


def decode_grpc_requests(stream_bytes: bytes) -> list[WireMessage]:
    """The gRPC requests in the client → server bytes of one HTTP/2 (h2c) connection, in stream order."""
    data = stream_bytes[len(_PREFACE):] if stream_bytes.startswith(_PREFACE) else stream_bytes
    per_stream: dict[int, bytearray] = {}
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos:pos + 3], "big")
        ftype, flags = data[pos + 3], data[pos + 4]
        stream = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
        payload = data[pos + 9:pos + 9 + length]
        pos += 9 + length
        if ftype != 0:  # only DATA frames carry messages
            continue
        if flags & 0x8:  # PADDED
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        per_stream.setdefault(stream, bytearray()).extend(payload)
    out: list[WireMessage] = []
    for stream in sorted(per_stream):
        body = bytes(per_stream[stream])
        while len(body) >= 5:
            size = int.from_bytes(body[1:5], "big")
            if body[0]:
                raise ValueError("compressed gRPC message: cannot decode")
            out.append(WireMessage(stream, _protobuf_fields(body[5:5 + size])))
            body = body[5 + size:]
    return out


class RecordingProxy(TcpProxy):
    """Forward 127.0.0.1:``port`` → ``target_port``, keeping a copy of every byte the client sends."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port, record=True)
        self.start()

    def messages(self) -> list[WireMessage]:
        with self._lock:
            return decode_grpc_requests(bytes(self.sent))
