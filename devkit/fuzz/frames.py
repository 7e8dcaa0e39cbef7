"""Hypothesis strategies for Remoting frames (RocketMQ 4.x clients' protocol, rocketraft/remoting/frame.py): valid
requests in both header encodings (JSON and the binary ROCKETMQ one), valid ones with one header field given a
hostile value, hostile header fixed fields and flags (oneway, response), random and malformed JSON bodies, byte-level
mutations of the frame and malformed frames made on purpose (bad lengths, truncation, a header length past the
frame, unknown serialize types, too many extFields, JSON headers that are not objects or nest without end).

Frames are encoded here, not with rocketraft's encoder, so that anything can be sent: a lone surrogate escaped in
JSON, invalid UTF-8 in a binary header, a field length that lies."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

from hypothesis import strategies as st

from rocketraft.protocol.limits import REMOTING_EXT_FIELDS_MAX, REMOTING_FRAME_BYTES_MAX

from .messages import mutated_bytes

SERIALIZE_JSON, SERIALIZE_ROCKETMQ = 0, 1
FLAG_RESPONSE, FLAG_ONEWAY = 0x1, 0x2
KIB_64 = 64 * 1024
DEEP = 100_000  # nesting of a JSON document that no recursive parser survives
BYTES_MAX = 256
# Values a header field (always a string on the wire) is given: empty, huge, negative, out of every integer width,
# numbers Python's int() reads and Java's parseLong does not (and the reverse), unicode, control characters
# (RocketMQ's property separators among them), a lone surrogate, 64 KiB, system topics
HOSTILE = (
    "", " ", "0", "-1", "1", "7", "8", "12", "16", "-2147483648", "2147483647", "2147483648", "4294967296",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "18446744073709551616", "9" * 5_000, "1e3", "1.5", "0x10", " 7", "7 ", "+7", "1_000", "\u0663", "\u00b9", "abc",
    "true", "false", "null", "NaN", "Infinity", "\U0001F642" * 128, "\u00fc", "\x00", "\x01", "\x02",
    "a\x01b\x02c\x01", "\ud800", "x" * 255, "x" * 256, "x" * KIB_64, "%RETRY%fuzz-group", "%DLQ%fuzz-group",
    "TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "*", "TagA || TagB", "a > 1", "a >", "SQL92", "TAG",
    "CLASS", "127.0.0.1:1", "7F0000010000000000000001", "0000000000000000FFFFFFFFFFFFFFFF",
)
# Header fields that exist in some request: a hostile value for one a request does not usually carry reaches code
# paths the template does not (an ACL signature on a door without ACL, the query-by-id switch, a batch flag)
EXTRA_KEYS = ("topic", "queueId", "consumerGroup", "group", "offset", "sysFlag", "batch", "_UNIQUE_KEY_QUERY",
              "AccessKey", "Signature", "SecurityToken", "commitOffset", "suspendTimeoutMillis", "expressionType",
              "subscription", "maxNum", "timestamp", "msgId", "clientID", "properties", "b", "m", "i")
INT32_EDGES = (0, 1, -1, 2, 3, 255, 256, 32_767, -32_768, 65_535, 65_536, 2**31 - 1, -2**31)


def hostile_text(strings: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), st.sampled_from(strings), st.text(max_size=40))


def json_values(strings: tuple[str, ...]) -> st.SearchStrategy:
    scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(INT32_EDGES + (2**63, -2**63 - 1, 10**30)),
                        st.integers(), st.floats(), hostile_text(strings))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.sampled_from(strings), st.text(max_size=12)),
                                                     inner, max_size=3)), max_leaves=12)


# -- encoding ---------------------------------------------------------------------------------------------------------
def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes bytes that are not UTF-8


def json_header(code, opaque, flag, ext, /, *, remark=None, ascii_only: bool = True, **overrides) -> bytes:
    header = {"code": code, "language": "JAVA", "version": 399, "opaque": opaque, "flag": flag,
              "serializeTypeCurrentRPC": "JSON"}
    if remark is not None:
        header["remark"] = remark
    if ext is not None:
        header["extFields"] = ext
    header.update(overrides)
    return _utf8(json.dumps(header, separators=(",", ":"), ensure_ascii=ascii_only))


def binary_header(code: int, opaque: int, flag: int, ext: dict[str, str], *, remark: str = "", language: int = 0,
                  version: int = 399) -> bytes:
    remark_bytes = _utf8(remark)
    fields = b"".join(struct.pack(">h", len(k := _utf8(key))) + k + struct.pack(">i", len(v := _utf8(value))) + v
                      for key, value in ext.items())
    return (struct.pack(">hBhii", code, language, version, opaque, flag) + struct.pack(">i", len(remark_bytes))
            + remark_bytes + struct.pack(">i", len(fields)) + fields)


def frame_bytes(serialize: int, header: bytes, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (serialize << 24) | len(header)) + header + body


def request(code: int, ext: dict[str, str], body: bytes, serialize: int, opaque: int, flag: int = 0,
            ascii_only: bool = True) -> bytes:
    header = json_header(code, opaque, flag, ext, ascii_only=ascii_only) if serialize == SERIALIZE_JSON \
        else binary_header(code, opaque, flag, ext)
    return frame_bytes(serialize, header, body)


# -- strategies -------------------------------------------------------------------------------------------------------
def _code(code: int, unknown: tuple[int, ...]) -> st.SearchStrategy[int]:
    return st.sampled_from(unknown) if code < 0 and unknown else st.just(code)


def _common(code: int, unknown: tuple[int, ...]):
    """(code, serialize, opaque)"""
    return st.tuples(_code(code, unknown), st.sampled_from((SERIALIZE_JSON, SERIALIZE_ROCKETMQ)),
                     st.integers(0, 2**31 - 1))


def _replaced(ext: dict[str, str], strings) -> st.SearchStrategy[dict[str, str]]:
    keys = tuple(ext) + tuple(k for k in EXTRA_KEYS if k not in ext)
    return st.tuples(st.sampled_from(keys), hostile_text(strings)).map(lambda kv: {**ext, kv[0]: kv[1]})


def _json_paths(value, at=()) -> list[tuple]:
    paths = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _json_paths(item, at + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            paths += _json_paths(item, at + (i,))
    return paths


def _with(value, path: tuple, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _with(value[path[0]], path[1:], new)
    return copy


def bodies(body: bytes, strings) -> st.SearchStrategy[bytes]:
    """A body in place of the template's: for a JSON body, one of its values (at any depth) replaced, a random JSON
    document, JSON nesting without end, JSON cut short, not UTF-8; for any body, random bytes, empty, 64 KiB."""
    options = [st.binary(max_size=BYTES_MAX), st.just(b""), st.just(b"\x00" * KIB_64),
               st.sampled_from((b"[" * DEEP, b'{"a":' * DEEP, b"[" * 1_000 + b"]" * 1_000, b"\xff\xfe{}", b"{",
                                b"null", b"[]", b'"x"', b"1e999999", b"-0", b'{"a":1,"a":2}'))]
    options.append(json_values(strings).map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8",
                                                                                               "surrogatepass")))
    try:
        document = json.loads(body) if body[:1] in (b"{", b"[") else None
    except ValueError:
        document = None
    if document is not None:
        paths = _json_paths(document)
        replaced = st.tuples(st.sampled_from(paths), json_values(strings)).map(
            lambda pv: json.dumps(_with(document, pv[0], pv[1])).encode())
        options += [replaced, replaced, st.integers(0, len(body) - 1).map(lambda n: body[:n])]
    return st.one_of(*options)


def unsigned(ext: dict[str, str], body: bytes) -> dict[str, str]:
    return ext


Signer = Callable[[dict[str, str], bytes], dict[str, str]]  # header fields and body -> the header fields sent


def malformed(code: int, ext: dict[str, str], body: bytes, sign: Signer = unsigned) -> st.SearchStrategy[bytes]:
    """Frames broken on purpose, each in a way a decoder must name: the length field (too short, negative, over the
    limit, a byte more or less than sent), cut short, a header length past the frame, unknown serialize types, JSON
    headers that are not objects or hold objects where strings belong, too many extFields, binary field lengths that
    lie, two frames in one write, a valid frame and garbage after it."""
    json_frame = request(code, sign(ext, body), body, SERIALIZE_JSON, 1)
    binary_frame = request(code, sign(ext, body), body, SERIALIZE_ROCKETMQ, 1)
    valid = st.sampled_from((json_frame, binary_frame))

    def set_length(data: bytes, value: int) -> bytes:
        return struct.pack(">i", value) + data[4:]

    def set_mark(data: bytes, serialize: int | None = None, header_len: int | None = None) -> bytes:
        (mark,) = struct.unpack_from(">i", data, 4)
        serialize = (mark >> 24) & 0xFF if serialize is None else serialize
        header_len = mark & 0xFFFFFF if header_len is None else header_len
        return data[:4] + struct.pack(">I", (serialize << 24) | header_len) + data[8:]

    lengths = st.tuples(valid, st.sampled_from((0, 1, 2, 3, 4, -1, -2**31, 2**31 - 1, REMOTING_FRAME_BYTES_MAX + 1,
                                                 REMOTING_FRAME_BYTES_MAX))).map(lambda dv: set_length(*dv))
    off_by = st.tuples(valid, st.sampled_from((-1, 1, 1000))).map(
        lambda dv: set_length(dv[0], len(dv[0]) - 4 + dv[1]))
    cut = valid.flatmap(lambda d: st.integers(1, len(d) - 1).map(lambda n: d[:n]))
    past = st.tuples(valid, st.sampled_from((1, 2, 1000, None))).map(
        lambda dv: set_mark(dv[0], header_len=0xFFFFFF if dv[1] is None else len(dv[0]) - 8 + dv[1]))
    zero_header = valid.map(lambda d: set_mark(d, header_len=0))
    serialize = st.tuples(valid, st.integers(2, 255)).map(lambda dv: set_mark(dv[0], serialize=dv[1]))
    swapped = st.one_of(st.just(set_mark(json_frame, serialize=SERIALIZE_ROCKETMQ)),
                        st.just(set_mark(binary_frame, serialize=SERIALIZE_JSON)))
    not_object = st.sampled_from((b"[]", b"1", b'"x"', b"null", b"", b"{", b"\xff\xfe", b"[" * DEEP,
                                  b'{"extFields":' * DEEP, b'{"code":10,"extFields":[]}',
                                  b'{"code":10,"extFields":{"topic":{"a":1}}}', b'{"code":10,"extFields":"x"}',
                                  b'{"code":10,"remark":[]}', b'{"code":"10"}', b'{"code":true}', b'{"code":1.0}',
                                  b'{"code":10,"opaque":4294967296}', b'{"code":10,"version":"x"}',
                                  b'{"code":10,"language":3.5}', b'{"code":10,"flag":null}',
                                  b'{"code":10,"language":[]}', b'{"code":NaN}', b'{"code":1e400}',
                                  b'{"code":10,"extFields":{"topic":' + b"[" * DEEP + b"}}",
                                  )).map(lambda header: frame_bytes(SERIALIZE_JSON, header, body))
    many = [REMOTING_EXT_FIELDS_MAX + 1, 1_000, 100_000]
    too_many = st.tuples(st.sampled_from(many), st.sampled_from((SERIALIZE_JSON, SERIALIZE_ROCKETMQ))).map(
        lambda ns: request(code, {**ext, **{f"k{i}": "v" for i in range(ns[0])}}, body, ns[1], 1))
    fixed = struct.pack(">hBhii", code, 0, 399, 1, 0)
    lying = st.sampled_from((
        fixed[:5], fixed + struct.pack(">i", -1), fixed + struct.pack(">i", 2**31 - 1) + b"x",
        fixed + struct.pack(">ii", 0, -1), fixed + struct.pack(">ii", 0, 100) + b"x",
        fixed + struct.pack(">ii", 0, 2) + struct.pack(">h", 1),
        fixed + struct.pack(">ii", 0, 7) + struct.pack(">h", -1) + b"\x00" * 5,
        fixed + struct.pack(">ii", 0, 7) + struct.pack(">h", 1) + b"k" + struct.pack(">i", -5),
        fixed + struct.pack(">ii", 0, 8) + struct.pack(">h", 1) + b"k" + struct.pack(">i", 50) + b"v",
        fixed + struct.pack(">i", 2) + b"\xff\xfe" + struct.pack(">i", 0),
        fixed + struct.pack(">ii", 0, 8) + struct.pack(">h", 1) + b"\xff" + struct.pack(">i", 1) + b"v",
    )).map(lambda header: frame_bytes(SERIALIZE_ROCKETMQ, header, body))
    pipelined = st.one_of(st.tuples(valid, valid).map(lambda ab: ab[0] + ab[1]),
                          st.tuples(valid, st.binary(min_size=1, max_size=64)).map(lambda vg: vg[0] + vg[1]))
    return st.one_of(lengths, off_by, cut, past, zero_header, serialize, swapped, not_object, too_many, lying,
                     pipelined)


def requests(code: int, ext: dict[str, str], body: bytes, strings: tuple[str, ...],
             unknown: tuple[int, ...] = (), sign: Signer = unsigned) -> st.SearchStrategy[tuple[str, bytes]]:
    """(kind, bytes written to the connection) of one request for a code (a negative code: one of `unknown`).
    `sign`: what the header fields become for a given body (ACL 1.0's AccessKey and Signature added, --hardened),
    applied to every request built from header fields, after its hostile value is in."""
    signed = sign(ext, body)

    def valid(c):
        code_, serialize, opaque = c
        return request(code_, signed, body, serialize, opaque)

    replaced = st.tuples(_common(code, unknown), _replaced(ext, strings), st.booleans()).map(
        lambda t: request(t[0][0], sign(t[1], body), body, t[0][1], t[0][2], ascii_only=t[2]))
    header_value = st.one_of(json_values(strings), st.sampled_from(INT32_EDGES + (2**32, 2**63, -2**63)))
    json_fixed = st.tuples(_code(code, unknown), st.sampled_from(
        ("code", "language", "version", "opaque", "flag", "remark", "extFields", "serializeTypeCurrentRPC")),
        header_value).map(lambda t: frame_bytes(SERIALIZE_JSON, json_header(t[0], 1, 0, signed, **{t[1]: t[2]}),
                                                body))
    binary_fixed = st.tuples(_code(code, unknown), st.integers(0, 255), st.integers(-2**15, 2**15 - 1),
                             st.sampled_from(INT32_EDGES), hostile_text(strings)).map(
        lambda t: frame_bytes(SERIALIZE_ROCKETMQ, binary_header(t[0], 1, t[3], signed, remark=t[4], language=t[1],
                                                                version=t[2]), body))
    flags = st.tuples(_common(code, unknown), st.one_of(st.sampled_from((FLAG_ONEWAY, FLAG_RESPONSE, 3)),
                                                        st.sampled_from(INT32_EDGES))).map(
        lambda t: request(t[0][0], signed, body, t[0][1], t[0][2], flag=t[1]))
    new_body = st.tuples(_common(code, unknown), bodies(body, strings)).map(
        lambda t: request(t[0][0], sign(ext, t[1]), t[1], t[0][1], t[0][2]))
    mutated = st.tuples(_common(code, unknown)).flatmap(lambda t: mutated_bytes(valid(t[0])))
    kinds = {
        "valid": _common(code, unknown).map(valid),
        "replaced": replaced,
        "header": st.one_of(json_fixed, binary_fixed),
        "flags": flags,
        "body": new_body,
        "mutated": mutated,
        "malformed": malformed(code if code >= 0 else 999, ext, body, sign),
        "garbage": st.binary(max_size=BYTES_MAX),
    }
    # each kind as likely as the others (st.one_of favours the branches hypothesis finds simplest)
    return st.sampled_from(tuple(kinds)).flatmap(lambda kind: kinds[kind].map(lambda data: (kind, data)))
