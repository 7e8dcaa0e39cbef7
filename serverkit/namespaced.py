"""Namespaces at a server's v2 door (the broker's MessagingService, the NameServer's QueryRoute and RecallMessage).

Before anything else sees a request (ACL 2.0, validation, the servicer), every apache.rocketmq.v2.Resource in it is
rewritten to its stored name, `<namespace>%<name>` (rocketraft.protocol.names holds the rule), with its
resource_namespace cleared: behind the door a name is its whole identity, so topics, queues, offsets, retry and
dead-letter topics, transaction check-backs, routes and ACL decisions of two namespaces never meet. Every Resource
of the answer is rewritten back to the name the client gave, in its namespace.

A call's namespace is its `x-mq-namespace` header's, else the one its resources name; a resource that names
another is refused (BAD_REQUEST naming both), as is an illegal namespace or a name with a '%' of its own inside a
namespace. Where the Resources are is read from the message descriptors once per type, so a field added to the
protocol is covered without a change here.
"""

from __future__ import annotations

import asyncio
import functools

from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol import names
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import pb
from serverkit import serving

_RESOURCE = pb.Resource.DESCRIPTOR
Path = tuple[FieldDescriptor, ...]


@functools.cache
def resource_paths(descriptor: Descriptor) -> tuple[Path, ...]:
    """Every chain of fields from a message of type `descriptor` down to a Resource field."""
    found: list[Path] = []

    def walk(message_type: Descriptor, path: Path, seen: frozenset) -> None:
        for field in message_type.fields:
            inner = field.message_type
            if inner is _RESOURCE:
                found.append((*path, field))
            elif inner is not None and inner not in seen:
                walk(inner, (*path, field), seen | {inner})

    walk(descriptor, (), frozenset({descriptor}))
    return tuple(found)


@functools.cache
def _steps(descriptor: Descriptor) -> tuple[tuple[str, tuple[tuple[str, bool], ...]], ...]:
    """resource_paths as (what the Resource names, ((field name, repeated), ...)): plain values for the hot path."""
    return tuple((names.GROUP if path[-1].name == "group" else names.TOPIC,
                  tuple((field.name, field.is_repeated) for field in path))
                 for path in resource_paths(descriptor))


def resources(message) -> list[tuple[str, pb.Resource]]:
    """(what it names: names.TOPIC or names.GROUP, the Resource) for every Resource set in `message`."""
    found = []
    for kind, steps in _steps(message.DESCRIPTOR):
        items = [message]
        for name, repeated in steps:
            if repeated:
                items = [item for parent in items for item in getattr(parent, name)]
            else:
                items = [getattr(parent, name) for parent in items if parent.HasField(name)]
        found.extend((kind, resource) for resource in items)
    return found


def inbound(request, header: str) -> str:
    """Rewrites every Resource of `request` to its stored name (resource_namespace cleared) and returns the call's
    namespace; BadRequestError (nothing rewritten) when the namespaces disagree or one is illegal."""
    found = resources(request)
    if not header and not any(r.resource_namespace for _, r in found):
        return ""  # no namespace: nothing to rewrite (the stored names' own rules are checked behind the door)
    namespace = names.call_namespace(header, ((k, r.name, r.resource_namespace) for k, r in found))
    if namespace:
        stored = [names.stored_name(namespace, r.name, kind) for kind, r in found]  # every check before any change
        for (_, resource), name in zip(found, stored, strict=True):
            resource.name = name
            resource.resource_namespace = ""
    return namespace


def outbound(response, namespace: str) -> None:
    """Rewrites every Resource of `response` in `namespace` to the name its client gives it, in that namespace.
    The response must be the call's own (servers build each one fresh): it is changed in place."""
    if not namespace:
        return
    for _, resource in resources(response):
        name = names.name_in(resource.name, namespace)
        if name != resource.name:
            resource.name, resource.resource_namespace = name, namespace


def header_of(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == names.NAMESPACE_HEADER:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


def namespaced(servicer, service: ServiceDescriptor, methods: set[str] | None = None):
    """`servicer` with every method of `service` (or those in `methods`) behind the namespace door."""
    wrapper = _Namespaced()
    for method in service.methods:
        impl = getattr(servicer, method.name)
        if methods is None or method.name in methods:
            response_cls = GetMessageClass(method.output_type)
            if method.client_streaming:
                impl = _stream(impl, response_cls)
            elif method.server_streaming:
                impl = _server_streaming(impl, response_cls)
            else:
                impl = _unary(impl, response_cls)
        setattr(wrapper, method.name, impl)
    return wrapper


class _Namespaced:
    pass


def _unary(impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        try:
            namespace = inbound(request, header_of(context))
        except RocketraftError as exc:
            return response_cls(status=exc.to_status())
        response = await impl(request, context)
        outbound(response, namespace)
        return response

    return handle


def _server_streaming(impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        try:
            namespace = inbound(request, header_of(context))
        except RocketraftError as exc:
            yield response_cls(status=exc.to_status())
            return
        async for response in impl(request, context):
            outbound(response, namespace)
            yield response

    return handle


def _stream(impl, response_cls):
    """A bidirectional stream (Telemetry): each frame through the door as it arrives (a refused one is answered
    with its status and not passed on); what the server sends, check-backs included, in the stream's namespace:
    the header's, else the one its last frame with resources named."""
    @functools.wraps(impl)
    async def handle(request_iterator, context):
        header = header_of(context)
        try:
            names.check_namespace(header)
        except RocketraftError as exc:
            yield response_cls(status=exc.to_status())
            return
        stream_namespace = [header]
        refusals: asyncio.Queue = asyncio.Queue()

        async def frames():
            async for frame in request_iterator:
                if isinstance(frame, serving.Undecodable):
                    yield frame  # the servicer answers it
                    continue
                try:
                    namespace = inbound(frame, header)
                except RocketraftError as exc:
                    await refusals.put(response_cls(status=exc.to_status()))
                    continue
                if namespace:
                    stream_namespace[0] = namespace
                yield frame

        async for response in serving.merged(impl(frames(), context), refusals):
            outbound(response, stream_namespace[0])
            yield response

    return handle
