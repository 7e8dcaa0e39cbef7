"""RocketMQ's Remoting frame: one RemotingCommand, its header in JSON or in RocketMQ's binary form.

A frame on the wire, big-endian: int32 length (of everything after it), int32 whose high byte is the header's
serialize type (0 JSON, 1 ROCKETMQ) and whose low 24 bits are the header's length, the header, the body. A response
is written in its request's serialize type. Every decode error is a FrameError naming what is wrong: the server
closes the connection with one log line (a frame boundary can no longer be trusted).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from rocketraft.protocol.limits import REMOTING_EXT_FIELDS_MAX, REMOTING_FRAME_BYTES_MAX

from .codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    SERVER_LANGUAGE,
    SERVER_VERSION,
    language_code,
    language_name,
)

LENGTH = struct.Struct(">i")
_BINARY_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
HEADER_BYTES_MAX = 0xFFFFFF


class FrameError(ValueError):
    """A frame that is not a Remoting frame, or breaks one of its limits."""


@dataclass
class Command:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str = ""
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: int = SERVER_LANGUAGE
    version: int = SERVER_VERSION
    serialize: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str = "", ext: dict[str, str] | None = None, body: bytes = b"") -> Command:
        """The answer to this request: its opaque, in its serialize type."""
        return Command(code=code, opaque=self.opaque, flag=FLAG_RESPONSE, remark=remark, ext=ext or {}, body=body,
                       serialize=self.serialize)


def check_length(length: int) -> None:
    """The frame length field read from the wire (the frame without that field)."""
    if length < 4:
        raise FrameError(f"frame length {length} is shorter than its header-length field")
    if length > REMOTING_FRAME_BYTES_MAX:
        raise FrameError(f"frame of {length} bytes is over the limit of {REMOTING_FRAME_BYTES_MAX} bytes "
                         "(RocketMQ's frameMaxLength)")


def decode(frame: bytes | memoryview) -> Command:
    """A command from one frame without its leading length field."""
    frame = memoryview(frame)
    check_length(len(frame))
    (mark,) = LENGTH.unpack_from(frame, 0)
    serialize, header_bytes = (mark >> 24) & 0xFF, mark & 0xFFFFFF
    if header_bytes > len(frame) - 4:
        raise FrameError(f"header length {header_bytes} is longer than the frame's {len(frame) - 4} bytes after it")
    header = frame[4:4 + header_bytes]
    if serialize == SERIALIZE_JSON:
        command = _json_header(bytes(header))
    elif serialize == SERIALIZE_ROCKETMQ:
        command = _binary_header(header)
    else:
        raise FrameError(f"serialize type {serialize} is unknown (0 JSON, 1 ROCKETMQ)")
    command.serialize = serialize
    command.body = bytes(frame[4 + header_bytes:])
    return command


def encode(command: Command) -> bytes:
    """One frame, its length field included."""
    header = _json_encode(command) if command.serialize == SERIALIZE_JSON else _binary_encode(command)
    if len(header) > HEADER_BYTES_MAX:
        raise FrameError(f"header of {len(header)} bytes does not fit the 24-bit header length")
    length = 4 + len(header) + len(command.body)
    return b"".join((LENGTH.pack(length), LENGTH.pack((command.serialize << 24) | len(header)), header, command.body))


# -- JSON headers (fastjson's field names) -------------------------------------------------------------------------
def _json_header(raw: bytes) -> Command:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"JSON header is not JSON: {exc}") from None
    except RecursionError:
        raise FrameError("JSON header is nested too deeply") from None
    if not isinstance(header, dict):
        raise FrameError("JSON header is not an object")
    ext = header.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("JSON header's extFields is not an object")
    _check_ext_count(len(ext))
    language = header.get("language", "OTHER")
    return Command(
        code=_json_int(header, "code", 16), opaque=_json_int(header, "opaque", 32), flag=_json_int(header, "flag", 32),
        version=_json_int(header, "version", 16, default=0), remark=_json_str(header.get("remark")),
        ext={_json_str(k): _json_str(v) for k, v in ext.items()},
        language=language_code(language) if isinstance(language, str) else _json_int(header, "language", 8))


def _json_int(header: dict, key: str, bits: int, default: int | None = None) -> int:
    value = header.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not -(1 << bits) < value < (1 << bits):
        raise FrameError(f"JSON header's {key} is {str(value)[:40]!r}, not a {bits}-bit integer")
    return value


def _json_str(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): JSON allows it, UTF-8 (and protobuf) does not
            raise FrameError("JSON header holds a string that is not valid Unicode (a lone surrogate)") from None
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise FrameError(f"JSON header holds {type(value).__name__} where a string belongs")


def _json_encode(command: Command) -> bytes:
    header = {"code": command.code, "language": language_name(command.language), "version": command.version,
              "opaque": command.opaque, "flag": command.flag, "serializeTypeCurrentRPC": "JSON"}
    if command.remark:
        header["remark"] = command.remark
    if command.ext:
        header["extFields"] = command.ext
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()


# -- ROCKETMQ binary headers ----------------------------------------------------------------------------------------
def _binary_header(header: memoryview) -> Command:
    try:
        code, language, version, opaque, flag = _BINARY_FIXED.unpack_from(header, 0)
        at = _BINARY_FIXED.size
        remark, at = _sized(header, at, 4)
        ext_bytes, at = _sized(header, at, 4)
    except struct.error:
        raise FrameError(f"binary header of {len(header)} bytes ends inside its fixed fields") from None
    return Command(code=code, opaque=opaque, flag=flag, version=version, language=language,
                   remark=_text(remark, "remark"), ext=_binary_ext(ext_bytes))


def _sized(data: memoryview, at: int, width: int) -> tuple[memoryview, int]:
    (length,) = struct.unpack_from(">i" if width == 4 else ">h", data, at)
    at += width
    if length < 0 or at + length > len(data):
        raise FrameError(f"a field of {length} bytes at {at} runs past the header's {len(data)} bytes")
    return data[at:at + length], at + length


def _binary_ext(data: memoryview) -> dict[str, str]:
    ext: dict[str, str] = {}
    at = 0
    try:
        while at < len(data):
            key, at = _sized(data, at, 2)
            value, at = _sized(data, at, 4)
            ext[_text(key, "extFields key")] = _text(value, "extFields value")
            _check_ext_count(len(ext))
    except struct.error:
        raise FrameError("binary header's extFields end inside an entry") from None
    return ext


def _text(raw: memoryview, what: str) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise FrameError(f"binary header's {what} is not UTF-8") from None


def _binary_encode(command: Command) -> bytes:
    remark = command.remark.encode()
    ext = b"".join(struct.pack(">h", len(k := key.encode())) + k + struct.pack(">i", len(v := value.encode())) + v
                   for key, value in command.ext.items())
    return b"".join((_BINARY_FIXED.pack(command.code, command.language, command.version, command.opaque, command.flag),
                     struct.pack(">i", len(remark)), remark, struct.pack(">i", len(ext)), ext))


def _check_ext_count(count: int) -> None:
    if count > REMOTING_EXT_FIELDS_MAX:
        raise FrameError(f"header has more than {REMOTING_EXT_FIELDS_MAX} extFields")
