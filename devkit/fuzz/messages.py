"""Hypothesis strategies for any protobuf request: random messages built from the descriptor, valid templates
with one field replaced, and mutated or random bytes. Values favour what breaks servers: boundaries of every
integer width, names at and over their limits, keys over LMDB's 511 bytes, control characters, unknown enum
values, times out of range."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

DEPTH_MAX = 3  # nested messages below this depth are left empty
REPEATED_MAX = 3
BYTES_MAX = 256  # random bytes (bodies at the size limit have their own tests; here they would fill the disk)

T = FieldDescriptor
INT_BOUNDS = {
    T.TYPE_INT32: (-2**31, 2**31 - 1), T.TYPE_SINT32: (-2**31, 2**31 - 1), T.TYPE_SFIXED32: (-2**31, 2**31 - 1),
    T.TYPE_INT64: (-2**63, 2**63 - 1), T.TYPE_SINT64: (-2**63, 2**63 - 1), T.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    T.TYPE_UINT32: (0, 2**32 - 1), T.TYPE_FIXED32: (0, 2**32 - 1),
    T.TYPE_UINT64: (0, 2**64 - 1), T.TYPE_FIXED64: (0, 2**64 - 1),
}
INT_EDGES = (0, 1, -1, 2, 7, 8, 255, 256, 511, 512, 65_535, 65_536, 2**31 - 1, -2**31, 2**32, 2**40, 2**53,
             2**63 - 1, -2**63, 2**64 - 1, 253_402_300_800, 1_000_000_000, 999_999_999)


def interesting_strings(names: tuple[str, ...]) -> tuple[str, ...]:
    """Strings that name real things of the fuzzed cluster, and strings at and over every limit."""
    return names + (
        "", " ", "*", "||", "a", "%DLQ%", "%RETRY%", "%DLQ%" + names[0], "TagA || TagB", "TagA||", "a b",
        "x" * 127, "x" * 128, "x" * 255, "x" * 256, "x" * 511, "x" * 512, "x" * 70_000, "\U0001F642" * 128,
        "a\x00b", "\n", "\t", "../../etc/passwd", "SELECT * FROM t", "127.0.0.1:1", "127.0.0.1:8081",
        "10000.0.1", "0.0.0", "1.2.3.4.5", "-1.-1.-1", "99999999999999999999.0.0", "0", "-1", "18", "19",
    )


def _in_range(edges: tuple[int, ...], low: int, high: int) -> tuple[int, ...]:
    return tuple(v for v in edges if low <= v <= high)


def scalar(field: FieldDescriptor, strings: tuple[str, ...]) -> st.SearchStrategy:
    kind = field.type
    if kind in INT_BOUNDS:
        low, high = INT_BOUNDS[kind]
        return st.one_of(st.sampled_from(_in_range(INT_EDGES, low, high)), st.integers(low, high))
    if kind == T.TYPE_BOOL:
        return st.booleans()
    if kind in (T.TYPE_FLOAT, T.TYPE_DOUBLE):
        return st.floats(width=32 if kind == T.TYPE_FLOAT else 64)
    if kind == T.TYPE_STRING:
        return st.one_of(st.sampled_from(strings), st.text(max_size=40))
    if kind == T.TYPE_BYTES:
        return st.binary(max_size=BYTES_MAX)
    if kind == T.TYPE_ENUM:
        known = tuple(v.number for v in field.enum_type.values)
        return st.one_of(st.sampled_from(known), st.integers(-2**31, 2**31 - 1))  # proto3 enums are open
    raise ValueError(f"no strategy for field {field.full_name} of type {kind}")


def message(descriptor: Descriptor, strings: tuple[str, ...], depth: int = 0) -> st.SearchStrategy[Message]:
    """A random message of this type: any subset of its fields, each with an interesting or random value."""
    cls = GetMessageClass(descriptor)
    if depth >= DEPTH_MAX:
        return st.just(cls())
    optional = {f.name: _field_value(f, strings, depth) for f in descriptor.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: _build(cls, values))


def _field_value(field: FieldDescriptor, strings: tuple[str, ...], depth: int) -> st.SearchStrategy:
    if _is_map(field):
        key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(scalar(key_field, strings), _single(value_field, strings, depth + 1),
                               max_size=REPEATED_MAX)
    one = _single(field, strings, depth)
    return st.lists(one, max_size=REPEATED_MAX) if _is_repeated(field) else one


def _single(field: FieldDescriptor, strings: tuple[str, ...], depth: int) -> st.SearchStrategy:
    if field.type == T.TYPE_MESSAGE:
        return st.deferred(lambda: message(field.message_type, strings, depth + 1))
    return scalar(field, strings)


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    return _is_repeated(field) and field.type == T.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _build(cls, values: dict) -> Message:
    msg = cls()
    for name, value in values.items():
        set_field(msg, name, value)
    return msg


def set_field(msg: Message, name: str, value) -> None:
    """Sets one field of msg, whatever its kind (scalar, message, repeated, map)."""
    field = msg.DESCRIPTOR.fields_by_name[name]
    target = getattr(msg, name) if (_is_repeated(field) or field.type == T.TYPE_MESSAGE) else None
    if _is_map(field):
        target.clear()
        for key, item in value.items():
            if isinstance(item, Message):
                target[key].CopyFrom(item)
            else:
                target[key] = item
    elif _is_repeated(field):
        del target[:]
        for item in value:
            target.add().CopyFrom(item) if isinstance(item, Message) else target.append(item)
    elif field.type == T.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(msg, name, value)


def with_one_field_replaced(template: Message, strings: tuple[str, ...]) -> st.SearchStrategy[Message]:
    """The valid template with one of its fields (at the top level) given a random value."""
    fields = template.DESCRIPTOR.fields
    if not fields:
        return st.just(template)

    def replace(choice):
        field, value = choice
        msg = type(template)()
        msg.CopyFrom(template)
        set_field(msg, field.name, value)
        return msg

    return st.sampled_from(tuple(fields)).flatmap(
        lambda f: _field_value(f, strings, 1).map(lambda v: (f, v))).map(replace)


def mutated_bytes(encoded: bytes) -> st.SearchStrategy[bytes]:
    """The encoded template with bytes flipped, cut off, or random bytes appended."""
    if not encoded:
        return st.binary(min_size=1, max_size=32)
    flips = st.lists(st.tuples(st.integers(0, len(encoded) - 1), st.integers(1, 255)), min_size=1, max_size=4)

    def flip(edits):
        data = bytearray(encoded)
        for at, mask in edits:
            data[at] ^= mask
        return bytes(data)

    return st.one_of(flips.map(flip), st.integers(0, len(encoded) - 1).map(lambda n: encoded[:n]),
                     st.binary(min_size=1, max_size=64).map(lambda tail: encoded + tail))


def request_bytes(descriptor: Descriptor, template: Message, strings: tuple[str, ...]) -> st.SearchStrategy:
    """(kind, bytes) of one request: valid, one field replaced, random message, mutated bytes, random bytes."""
    encoded = template.SerializeToString()
    return st.one_of(
        st.just(("valid", encoded)),
        with_one_field_replaced(template, strings).map(lambda m: ("replaced", m.SerializeToString())),
        message(descriptor, strings).map(lambda m: ("random", m.SerializeToString())),
        mutated_bytes(encoded).map(lambda b: ("mutated", b)),
        st.binary(max_size=BYTES_MAX).map(lambda b: ("garbage", b)),
    )
