"""What a Raft message from a peer must look like before the engine or pysyncobj reads it.

pysyncobj indexes its messages without checking them: a `{}`, or an append_entries without its commit index,
from anything that reaches the Raft port raised inside the Raft thread and stopped the replica. Every message is
checked here first (a pure function, like raftrules): its type is one dledger or pysyncobj sends, and every field
that type's handler reads is there with the right type. A message that fails closes its connection and is
logged; the replica goes on. Fields a handler does not read may be anything.
"""

from __future__ import annotations

_INT = (int,)
_NOTHING = (type(None),)

# message type -> {field: accepted types} for the fields every handler of that type reads
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "request_vote": {"term": _INT, "last_log_index": _INT, "last_log_term": _INT},
    "response_vote": {"term": _INT},
    "timeout_now": {"term": _INT},
    "append_entries": {"term": _INT, "commit_index": _INT},
    "next_node_idx": {"next_node_idx": _INT, "reset": (bool,), "success": (bool,)},
    "apply_command": {"command": (bytes,)},
    "apply_command_response": {"request_id": _INT},
    "dl_hello": {"replica": (str,), "group": (str,), "history": (str,), "incarnation": (str,), "nonce": (str,),
                 "genesis": (list,), "voter": (bool,), "untrusted": (bool,), "last": (list,)},
    "dl_prevote": {"term": _INT, "last_log_index": _INT, "last_log_term": _INT},
    "dl_prevote_resp": {"term": _INT, "granted": (bool,)},
    "dl_snapshot_progress": {},
    "dl_stale_term": {"term": _INT},
    "dl_not_member": {"group": (str,), "members": (str,)},
    "dl_fetch_entry": {"index": _INT, "term": _INT},
    "dl_fetch_entry_resp": {"index": _INT, "term": _INT, "command": (bytes, *_NOTHING), "reason": (str,)},
}
TRANSMISSIONS = ("start", "process", "finish")
CLOCK_STAMPED = ("append_entries", "next_node_idx")  # may carry a group-clock stamp (groupclock.STAMP_FIELD)
CLOCK_STAMP = "dl_clock"  # pysyncobj's chunks of one entry too large for one message


def problem(message: object) -> str | None:
    """Why `message` must not be handled, or None if it has the shape its handlers read."""
    if not isinstance(message, dict):
        return f"a Raft message is a dict, not a {type(message).__name__}"
    kind = message.get("type")
    fields = FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return f"unknown message type {kind!r}"[:200]
    for name, types in fields.items():
        wrong = _wrong(message, name, types)
        if wrong:
            return f"{kind}: {wrong}"
    extra = _append_entries_problem(message) if kind == "append_entries" else _response_problem(message) \
        if kind == "apply_command_response" else None
    if extra is None and kind in CLOCK_STAMPED and CLOCK_STAMP in message:
        extra = _clock_stamp_problem(message[CLOCK_STAMP])
    return f"{kind}: {extra}" if extra else None


def _clock_stamp_problem(stamp: object) -> str | None:
    if isinstance(stamp, list) and len(stamp) == 2 and all(type(v) is int and 0 <= v < 2**63 for v in stamp):
        return None
    return f"{CLOCK_STAMP} is not [two non-negative ints]"


def _wrong(message: dict, name: str, types: tuple[type, ...]) -> str | None:
    if name not in message:
        return f"no {name}"
    value = message[name]
    if type(value) is bool and bool not in types:  # bool is an int to isinstance; a term is not a bool
        return f"{name} is a bool"
    if not isinstance(value, types):
        return f"{name} is a {type(value).__name__}"
    return None


def _append_entries_problem(message: dict) -> str | None:
    if "prevLogIdx" in message:
        for name in ("prevLogIdx", "prevLogTerm"):
            wrong = _wrong(message, name, (*_INT, *_NOTHING))
            if wrong:
                return wrong
    entries = message.get("entries", [])
    if not isinstance(entries, list):
        return f"entries is a {type(entries).__name__}"
    for entry in entries:
        if not (isinstance(entry, tuple | list) and len(entry) == 3 and isinstance(entry[0], bytes)
                and all(type(v) is int for v in entry[1:])):
            return "an entry is not (command bytes, index, term)"
    transmission = message.get("transmission")
    if transmission is not None and (transmission not in TRANSMISSIONS or not isinstance(message.get("data"),
                                                                                          bytes | str)):
        return "a bad chunked transmission"
    serialized = message.get("serialized")
    if serialized is not None and not (isinstance(serialized, tuple) and len(serialized) == 3
                                       and isinstance(serialized[0], bytes)
                                       and all(type(v) is bool for v in serialized[1:])):
        return "serialized is not (chunk bytes, first, last)"
    return None


def _response_problem(message: dict) -> str | None:
    if message.get("error") is not None:
        return None
    return _wrong(message, "log_idx", _INT) or _wrong(message, "log_term", _INT)
