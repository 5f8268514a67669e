"""Python values ⇄ Feast ``Value`` protos, and ⇄ the bytes Feast's Redis online store keeps.

Serving reads and writes about twenty features per cardholder per transaction. Going through one ``Value``
object per feature (and through Feast's per-entity dict of them) cost more client CPU than the Redis round
trip itself, so the Redis path (:mod:`fedfraud.feature_store.redis_store`) decodes stored bytes straight to
Python values and encodes Python values straight to bytes. The bytes are exactly
``Value(...).SerializeToString()``, and None is the empty ``Value`` as in Feast's push: Feast, its CLI
and materialisation read them unchanged (``tests/unit/test_feast_values.py`` checks every kind against
upb, including the hand-written fast paths, and ``tests/integration/test_feature_store_online.py`` that a
stored hash is byte for byte the SDK push's). One difference: the SDK stores a NaN double as null, this
module stores its bits.

A feature's kind comes from its declared dtype, the way Feast's push converts a frame, so the feature
repo's ``definitions.py`` stays the one declaration of a cardholder's fields.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from feast.protos.feast.types.Value_pb2 import FloatList
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.value_type import ValueType

__all__ = ["from_proto", "from_wire", "to_proto", "to_wire", "value_kind", "wire_encoder"]

#: The ``Value`` oneof field of each supported Feast value type.
_KINDS: dict[ValueType, str] = {
    ValueType.INT64: "int64_val",
    ValueType.DOUBLE: "double_val",
    ValueType.STRING: "string_val",
    ValueType.BYTES: "bytes_val",
    ValueType.FLOAT_LIST: "float_list_val",
}

_DOUBLE = struct.Struct("<d")
_DOUBLE_TAG = 0x29  # field 5 (double_val), wire type 1 (64-bit)
_DOUBLE_PREFIX = bytes((_DOUBLE_TAG,))
_FLOAT_LIST_TAG = b"\x82\x01"  # field 16 (float_list_val), wire type 2 (length-delimited)
_PACKED_TAG = 0x0A  # FloatList.val: field 1, packed


def value_kind(dtype: Any) -> str:
    """The ``Value`` field that holds a feature of Feast dtype ``dtype`` (``Int64``, ``Array(Float32)``, …)."""
    value_type = dtype.to_value_type() if hasattr(dtype, "to_value_type") else dtype
    try:
        return _KINDS[value_type]
    except KeyError:
        raise ValueError(f"feature dtype {dtype} is not one the online client stores") from None


def _float_array(value: Any) -> np.ndarray:
    """``value`` as a 1-D little-endian float32 array; what upb's ``FloatList`` would refuse raises TypeError."""
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "biuf":
        raise TypeError(f"a float list feature needs a 1-D sequence of numbers, got {type(value).__name__} {arr.dtype}")
    return arr.astype("<f4", copy=False)


def to_proto(kind: str, value: Any) -> ValueProto:
    """``value`` as a Feast ``Value`` of ``kind`` (what Feast's generic ``online_write_batch`` takes).

    None is the empty ``Value``, as Feast's push writes a null of any type.
    """
    if value is None:
        return ValueProto()
    if kind == "float_list_val":
        return ValueProto(float_list_val=FloatList(val=_float_array(value).tolist()))
    return ValueProto(**{kind: value})


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _double_wire(value: Any) -> bytes:
    if value is None:
        return b""
    try:
        return _DOUBLE_PREFIX + _DOUBLE.pack(value)
    except struct.error:
        raise TypeError(f"a double feature needs a number, got {type(value).__name__}") from None


def _float_list_wire(value: Any) -> bytes:
    if value is None:
        return b""
    data = _float_array(value).tobytes()
    inner = bytes((_PACKED_TAG,)) + _varint(len(data)) + data if data else b""
    return _FLOAT_LIST_TAG + _varint(len(inner)) + inner


def _proto_wire(kind: str) -> Callable[[Any], bytes]:
    def wire(value: Any) -> bytes:
        return b"" if value is None else ValueProto(**{kind: value}).SerializeToString()

    return wire


#: Kind → encoder. Doubles and float lists (11 of a cardholder's 18 fields) skip the proto object.
_WIRE: dict[str, Callable[[Any], bytes]] = {
    "int64_val": _proto_wire("int64_val"),
    "string_val": _proto_wire("string_val"),
    "bytes_val": _proto_wire("bytes_val"),
    "double_val": _double_wire,
    "float_list_val": _float_list_wire,
}


def wire_encoder(kind: str) -> Callable[[Any], bytes]:
    """The encoder :func:`to_wire` uses for ``kind``: look it up once per feature, call it per value."""
    try:
        return _WIRE[kind]
    except KeyError:
        raise ValueError(f"no wire encoder for Value kind {kind!r}") from None


def to_wire(kind: str, value: Any) -> bytes:
    """``to_proto(kind, value).SerializeToString()``, without building the proto for doubles and float lists."""
    return wire_encoder(kind)(value)


def from_proto(value: ValueProto) -> Any:
    """The Python value of a ``Value`` (None when unset); float lists come back as float32 arrays."""
    kind = value.WhichOneof("val")
    if kind is None or kind == "null_val":
        return None
    if kind == "float_list_val":
        values = value.float_list_val.val
        return np.fromiter(values, dtype=np.float32, count=len(values))
    return getattr(value, kind)


def _read_varint(raw: bytes, i: int) -> tuple[int, int]:
    """A varint at ``raw[i]`` and the index after it; IndexError when truncated or longer than 10 bytes."""
    result = shift = 0
    while shift < 70:
        byte = raw[i]
        result |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return result, i
        shift += 7
    raise IndexError("varint longer than 10 bytes")


def _float_list(raw: bytes) -> np.ndarray | None:
    """A serialised ``Value(float_list_val=...)`` of one packed run, or None to let upb parse it."""
    try:
        size, i = _read_varint(raw, len(_FLOAT_LIST_TAG))
        if i + size != len(raw):
            return None
        if size == 0:
            return np.zeros(0, dtype=np.float32)
        if raw[i] != _PACKED_TAG:
            return None
        n, j = _read_varint(raw, i + 1)
    except IndexError:
        return None
    if j + n != len(raw) or n % 4:
        return None
    return np.frombuffer(raw, dtype="<f4", count=n // 4, offset=j).astype(np.float32)


def from_wire(raw: bytes | None) -> Any:
    """:func:`from_proto` of a serialised ``Value`` (None for a missing or empty field)."""
    if not raw:
        return None
    if raw[0] == _DOUBLE_TAG and len(raw) == 1 + _DOUBLE.size:
        return _DOUBLE.unpack_from(raw, 1)[0]
    if raw.startswith(_FLOAT_LIST_TAG):
        values = _float_list(raw)
        if values is not None:
            return values
    return from_proto(ValueProto.FromString(raw))
