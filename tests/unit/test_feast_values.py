"""The Redis path's Value codec writes exactly the bytes upb writes, and reads back what upb reads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from feast.protos.feast.types.Value_pb2 import FloatList
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.types import Array, Bytes, Float32, Float64, Int64, String
from hypothesis import given
from hypothesis import strategies as st

from fedfraud.feature_store.feast_values import from_proto, from_wire, to_proto, to_wire, value_kind

float32s = st.floats(width=32, allow_nan=False)
VALUES = {
    "int64_val": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "double_val": st.floats(allow_nan=False) | st.integers(min_value=-(2**53), max_value=2**53),
    "string_val": st.text(max_size=40),
    "bytes_val": st.binary(max_size=5000),
    "float_list_val": st.lists(float32s, max_size=300)
    | st.lists(st.floats(allow_nan=False, min_value=-1e38, max_value=1e38), max_size=50)  # float64 in, rounded
    | st.lists(float32s, max_size=50).map(lambda v: np.asarray(v, dtype=np.float64)),
}


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_bytes_are_upbs_and_decode_back(kind: str) -> None:
    @given(VALUES[kind])
    def check(value: object) -> None:
        wire = to_wire(kind, value)
        assert wire == to_proto(kind, value).SerializeToString()
        if kind == "float_list_val":
            expected = ValueProto(float_list_val=FloatList(val=list(value))).SerializeToString()  # type: ignore[call-overload]
            assert wire == expected
            back = from_wire(wire)
            assert back.dtype == np.float32 and back.flags.writeable
            np.testing.assert_array_equal(back, np.asarray(value, dtype=np.float32))
            np.testing.assert_array_equal(back, from_proto(ValueProto.FromString(wire)))
        else:
            assert wire == ValueProto(**{kind: value}).SerializeToString()
            back = from_wire(wire)
            assert back == from_proto(ValueProto.FromString(wire))
            assert back == (float(value) if kind == "double_val" else value)  # type: ignore[arg-type]

    check()


def test_nan_and_float32_inputs_keep_their_bits() -> None:
    assert to_wire("double_val", math.nan) == ValueProto(double_val=math.nan).SerializeToString()
    assert math.isnan(from_wire(to_wire("double_val", math.nan)))
    arr = np.array([np.nan, -0.0, np.inf, 1e-45], dtype=np.float32)
    assert to_wire("float_list_val", arr) == to_proto("float_list_val", arr).SerializeToString()


def test_numpy_scalars_and_none() -> None:
    assert to_wire("double_val", np.float64(2.5)) == ValueProto(double_val=2.5).SerializeToString()
    assert to_wire("double_val", np.float32(0.1)) == ValueProto(double_val=float(np.float32(0.1))).SerializeToString()
    assert to_wire("double_val", 3) == ValueProto(double_val=3.0).SerializeToString()
    assert to_wire("int64_val", np.int64(-7)) == ValueProto(int64_val=-7).SerializeToString()
    for kind in VALUES:  # a null is the empty Value, as Feast's push writes it
        assert to_wire(kind, None) == b"" == to_proto(kind, None).SerializeToString()


@pytest.mark.parametrize("bad", [np.float32(1.0), np.zeros((2, 2)), ["1.5"], [1.0, None], "abc"])
def test_float_lists_upb_would_refuse_are_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="float list"):
        to_wire("float_list_val", bad)
    with pytest.raises(TypeError):
        to_proto("float_list_val", bad)


def test_bad_scalars_raise_type_errors() -> None:
    with pytest.raises(TypeError, match="double"):
        to_wire("double_val", "1.5")
    with pytest.raises(ValueError, match="no wire encoder"):
        to_wire("uint64_val", 1)


def test_unusual_encodings_fall_back_to_upb() -> None:
    """Bytes another writer may produce (unpacked floats, a repeated field) decode like upb decodes them."""
    unpacked = b"\x82\x01\x0a" + b"\x0d" + np.float32(1.5).tobytes() + b"\x0d" + np.float32(2.5).tobytes()
    np.testing.assert_array_equal(from_wire(unpacked), [1.5, 2.5])
    twice = ValueProto(double_val=1.0).SerializeToString() + ValueProto(double_val=2.0).SerializeToString()
    assert from_wire(twice) == 2.0  # protobuf: the last one wins
    assert from_wire(ValueProto(null_val=0).SerializeToString()) is None
    assert from_wire(b"") is None and from_wire(None) is None
    from google.protobuf.message import DecodeError

    overlong = b"\x82\x01" + b"\x80" * 11 + b"\x00"  # a length varint over 10 bytes: upb's to judge
    with pytest.raises(DecodeError):
        ValueProto.FromString(overlong)
    with pytest.raises(DecodeError):
        from_wire(overlong)


def test_kinds_follow_the_declared_dtypes() -> None:
    assert [value_kind(t) for t in (Int64, Float64, String, Bytes, Array(Float32))] == [
        "int64_val",
        "double_val",
        "string_val",
        "bytes_val",
        "float_list_val",
    ]
    with pytest.raises(ValueError, match="not one the online client stores"):
        value_kind(Float32)
