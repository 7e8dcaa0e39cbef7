"""RocketMQ's naming rules, in one place for the broker, the NameServer and the clients.

Namespaces (RocketMQ 5's `x-mq-namespace` header and `Resource.resource_namespace`): topic T and consumer group G
of namespace N are stored, routed, consumed and offset-tracked as `N%T` and `N%G`, RocketMQ's NamespaceUtil form,
with a retry or dead-letter prefix kept in front (`%RETRY%N%G`, `%DLQ%N%G`). The mapping is one-to-one: a
namespace is made of [a-zA-Z0-9_-] and a name inside a namespace has no '%' of its own, so no two (namespace,
name) pairs share a stored name, and every stored name with a '%' after its prefix reads back as exactly one
pair. A client without a namespace (an admin tool, say) may name a namespaced topic by its stored name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import (
    DLQ_TOPIC_PREFIX,
    GROUP_NAME_CHARS_MAX,
    NAMESPACE_CHARS_MAX,
    RETRY_TOPIC_PREFIX,
    TOPIC_NAME_CHARS_MAX,
)
from rocketraft.protocol.wire import Code

NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # fullmatch: "^...$" with match would accept a trailing newline
TOPIC_NAME_RULE = f"topic names match ^[%|a-zA-Z0-9_-]+$ and are at most {TOPIC_NAME_CHARS_MAX} characters"

NAMESPACE_HEADER = "x-mq-namespace"  # what the official SDKs send with every call (empty without a namespace)
NAMESPACE_SEPARATOR = "%"
NAMESPACE_PATTERN = re.compile(r"[a-zA-Z0-9_-]+")
NAMESPACE_RULE = f"namespaces match ^[a-zA-Z0-9_-]+$ and are at most {NAMESPACE_CHARS_MAX} characters"
SYSTEM_PREFIXES = (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX)  # stay in front of a namespace: %RETRY%<ns>%<group>
STORED_FORM_RULE = (f"a '%' after the %RETRY% or %DLQ% prefix separates a namespace from a name: "
                    f"<namespace>%<name>, with {NAMESPACE_RULE} and no other '%'")

TOPIC, GROUP = "topic", "consumer group"  # what a name names, in messages
_ILLEGAL = {TOPIC: Code.ILLEGAL_TOPIC, GROUP: Code.ILLEGAL_CONSUMER_GROUP}


def check_topic_name(name: str) -> str:
    """Raise BadRequestError(ILLEGAL_TOPIC) naming the rule unless `name` follows it."""
    if len(name) > TOPIC_NAME_CHARS_MAX:
        problem = f"{len(name)} characters is longer than {TOPIC_NAME_CHARS_MAX}{_counted(name)}"
    elif not NAME_PATTERN.fullmatch(name):
        problem = "it is empty" if not name else "it has characters outside ^[%|a-zA-Z0-9_-]+$"
    elif _stored_form_broken(name):
        problem = STORED_FORM_RULE
    else:
        return name
    raise BadRequestError(f"illegal topic name {name[:TOPIC_NAME_CHARS_MAX + 1]!r}: {problem}; {TOPIC_NAME_RULE}",
                          Code.ILLEGAL_TOPIC)


def check_group_name(name: str) -> str:
    if not name or len(name) > GROUP_NAME_CHARS_MAX or not NAME_PATTERN.fullmatch(name):
        raise BadRequestError(f"illegal consumer group {name[:GROUP_NAME_CHARS_MAX + 1]!r}: use "
                              f"1..{GROUP_NAME_CHARS_MAX} of [%|a-zA-Z0-9_-]{_counted(name)}",
                              Code.ILLEGAL_CONSUMER_GROUP)
    if _stored_form_broken(name):
        raise BadRequestError(f"illegal consumer group {name!r}: {STORED_FORM_RULE}", Code.ILLEGAL_CONSUMER_GROUP)
    return name


def retry_topic(group: str) -> str:
    """The topic a consumer group's retried messages live in."""
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """The topic a consumer group's dead letters go to."""
    return DLQ_TOPIC_PREFIX + group


# -- namespaces ---------------------------------------------------------------------------------------------------

def check_namespace(namespace: str) -> str:
    """"" (no namespace) or a valid namespace; BadRequestError naming the value and the rule otherwise."""
    if not namespace:
        return namespace
    if len(namespace) > NAMESPACE_CHARS_MAX:
        problem = f"{len(namespace)} characters is longer than {NAMESPACE_CHARS_MAX}"
    elif not NAMESPACE_PATTERN.fullmatch(namespace):
        problem = "it has characters outside ^[a-zA-Z0-9_-]+$"
    else:
        return namespace
    raise BadRequestError(f"illegal namespace {namespace[:NAMESPACE_CHARS_MAX + 1]!r}: {problem}; {NAMESPACE_RULE}")


def stored_name(namespace: str, name: str, kind: str = TOPIC) -> str:
    """The name topic or group `name` of `namespace` is stored under: `namespace%name` (a %RETRY% or %DLQ% prefix
    stays in front), `name` itself without a namespace or without a name. BadRequestError naming both when the
    namespace is illegal or `name` has a '%' of its own; the stored name's own rules (characters, length) are
    checked where it is used (check_topic_name, check_group_name)."""
    if not namespace or not name:
        return name
    check_namespace(namespace)
    prefix, rest = _split_prefix(name)
    if NAMESPACE_SEPARATOR in rest or not rest:
        problem = (f"{prefix} needs a name after it" if not rest else
                   f"a name inside a namespace has no '%' of its own (the namespace is given apart, and the broker "
                   f"stores the name as {namespace}%<name>); give the name without its namespace")
        raise BadRequestError(f"illegal {kind} {name[:GROUP_NAME_CHARS_MAX + 1]!r} in namespace {namespace!r}: "
                              f"{problem}", _ILLEGAL.get(kind, Code.BAD_REQUEST))
    return f"{prefix}{namespace}{NAMESPACE_SEPARATOR}{rest}"


def namespace_of(stored: str) -> str:
    """The namespace of a stored topic or group name ("" for a name in no namespace)."""
    namespace, separator, _ = _split_prefix(stored)[1].partition(NAMESPACE_SEPARATOR)
    return namespace if separator else ""


def name_in(stored: str, namespace: str) -> str:
    """How a client of `namespace` names the stored topic or group `stored`: without the namespace when the name
    is in it (a retry or dead-letter prefix kept), else the stored name itself."""
    if not namespace:
        return stored
    prefix, rest = _split_prefix(stored)
    cut = len(namespace) + 1
    if rest[:cut] != namespace + NAMESPACE_SEPARATOR:
        return stored
    return prefix + rest[cut:]


def call_namespace(header: str, resources: Iterable[tuple[str, str, str]]) -> str:
    """The one namespace of a v2 call: its x-mq-namespace header's, else the one its resources name (a resource
    without a namespace is in the call's; the Node.js SDK sends most of them so). `resources` are (kind, name,
    resource_namespace). BadRequestError naming the resource and both namespaces when they disagree."""
    namespace = check_namespace(header)
    said_by = f"the {NAMESPACE_HEADER} header"
    for kind, name, theirs in resources:
        if not theirs or theirs == namespace:
            continue
        if namespace:
            raise BadRequestError(f"{kind} {name[:GROUP_NAME_CHARS_MAX + 1]!r} is in namespace "
                                  f"{theirs[:NAMESPACE_CHARS_MAX + 1]!r} but "
                                  f"{said_by} names namespace {namespace!r}: one call, one namespace; give every "
                                  f"resource the client's namespace (or none) and send the same {NAMESPACE_HEADER}")
        namespace, said_by = check_namespace(theirs), f"{kind} {name[:GROUP_NAME_CHARS_MAX + 1]!r}"
    return namespace


def _split_prefix(name: str) -> tuple[str, str]:
    if not name.startswith("%"):
        return "", name
    for prefix in SYSTEM_PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def _stored_form_broken(name: str) -> bool:
    """Whether a name with a '%' after its prefix is not <namespace>%<name> (so could read as two pairs)."""
    namespace, separator, rest = _split_prefix(name)[1].partition(NAMESPACE_SEPARATOR)
    if not separator:
        return False
    return (not rest or NAMESPACE_SEPARATOR in rest or len(namespace) > NAMESPACE_CHARS_MAX
            or not NAMESPACE_PATTERN.fullmatch(namespace))


def _counted(name: str) -> str:
    """For a name too long: that its namespace counts, when it has one."""
    namespace = namespace_of(name)
    if not namespace or len(namespace) > NAMESPACE_CHARS_MAX or not NAMESPACE_PATTERN.fullmatch(namespace):
        return ""
    return f" (a name of namespace {namespace!r} is stored as {namespace}%<name>, and that is what counts)"
