"""The namespace rule (rocketraft.protocol.names) and the v2 door that applies it (serverkit.namespaced),
without a cluster: stored names are one-to-one, every Resource of every v2 message is found, a call has one
namespace, and answers go back in the client's namespace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketraft.protocol import names
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import NAMESPACE_CHARS_MAX
from rocketraft.protocol.wire import Code, pb, svc
from serverkit.namespaced import inbound, outbound, resource_paths

NAMESPACES = st.one_of(st.just(""), st.text("abcZ09_-", min_size=1, max_size=NAMESPACE_CHARS_MAX))
BARE = st.text("abcXYZ09_|-", min_size=1, max_size=40)  # a name as a client gives it in a namespace
PREFIXES = st.sampled_from(("", "%RETRY%", "%DLQ%"))


@settings(max_examples=500, deadline=None)
@given(NAMESPACES, PREFIXES, BARE)
def test_a_stored_name_is_legal_and_reads_back_as_its_namespace_and_name(namespace, prefix, bare):
    stored = names.stored_name(namespace, prefix + bare)
    assert names.check_topic_name(stored) == stored
    assert names.namespace_of(stored) == namespace
    assert names.name_in(stored, namespace) == prefix + bare
    if namespace:
        assert stored == f"{prefix}{namespace}%{bare}"  # RocketMQ's NamespaceUtil form


@settings(max_examples=500, deadline=None)
@given(NAMESPACES, PREFIXES, BARE, NAMESPACES, PREFIXES, BARE)
def test_two_different_namespace_and_name_pairs_never_share_a_stored_name(ns1, p1, n1, ns2, p2, n2):
    if (ns1, p1 + n1) != (ns2, p2 + n2):
        assert names.stored_name(ns1, p1 + n1) != names.stored_name(ns2, p2 + n2)


@pytest.mark.parametrize("name", ["%orders", "a%%b", "a%b%c", "a%", "%RETRY%%g", "%DLQ%a%b%c", "a|b%c",
                                  "x" * (NAMESPACE_CHARS_MAX + 1) + "%t"])
def test_a_name_whose_percent_does_not_separate_one_namespace_from_one_name_is_refused(name):
    with pytest.raises(BadRequestError, match="separates a namespace from a name") as e:
        names.check_topic_name(name)
    assert e.value.code == Code.ILLEGAL_TOPIC
    with pytest.raises(BadRequestError, match="separates a namespace from a name"):
        names.check_group_name(name)


def test_names_without_percent_and_retry_and_dead_letter_topics_stay_legal():
    for name in ("orders", "a|b", "%RETRY%g", "%DLQ%g", "%RETRY%t-1%g", "t-1%orders"):
        assert names.check_topic_name(name) == name


@pytest.mark.parametrize(("namespace", "words"), [
    ("a b", "characters outside ^[a-zA-Z0-9_-]+$"), ("a%b", "characters outside"), ("a.b", "characters outside"),
    ("n" * (NAMESPACE_CHARS_MAX + 1), f"{NAMESPACE_CHARS_MAX + 1} characters is longer than {NAMESPACE_CHARS_MAX}"),
])
def test_an_illegal_namespace_is_refused_naming_it_and_the_rule(namespace, words):
    with pytest.raises(BadRequestError, match="illegal namespace") as e:
        names.check_namespace(namespace)
    assert words in e.value.message and names.NAMESPACE_RULE in e.value.message


def test_a_name_with_its_own_percent_inside_a_namespace_is_refused_naming_both():
    with pytest.raises(BadRequestError) as e:
        names.stored_name("t1", "t2%orders")
    assert e.value.code == Code.ILLEGAL_TOPIC and "'t2%orders' in namespace 't1'" in e.value.message
    with pytest.raises(BadRequestError) as e:
        names.stored_name("t1", "t2%g", names.GROUP)
    assert e.value.code == Code.ILLEGAL_CONSUMER_GROUP


def test_a_namespaced_name_too_long_says_its_namespace_counts():
    with pytest.raises(BadRequestError, match="is stored as t1%<name>, and that is what counts"):
        names.check_topic_name(names.stored_name("t1", "x" * 125))


def test_a_call_has_one_namespace_the_headers_or_its_resources():
    assert names.call_namespace("", [("topic", "T", ""), ("consumer group", "g", "")]) == ""
    assert names.call_namespace("a", [("topic", "T", ""), ("consumer group", "g", "a")]) == "a"
    assert names.call_namespace("", [("topic", "T", "a"), ("consumer group", "g", "")]) == "a"
    with pytest.raises(BadRequestError, match="'T' is in namespace 'b' but the x-mq-namespace header names "
                                              "namespace 'a'"):
        names.call_namespace("a", [("topic", "T", "b")])
    with pytest.raises(BadRequestError, match="consumer group 'g' is in namespace 'b' but topic 'T' names namespace "
                                              "'a'"):
        names.call_namespace("", [("topic", "T", "a"), ("consumer group", "g", "b")])


# -- the door ----------------------------------------------------------------------------------------------------

def test_every_resource_of_every_v2_message_is_found_from_the_descriptors():
    def paths(message_cls) -> set[str]:
        return {".".join(f.name for f in path) for path in resource_paths(message_cls.DESCRIPTOR)}

    assert paths(svc.SendMessageRequest) == {"messages.topic"}
    assert paths(svc.ReceiveMessageRequest) == {"group", "message_queue.topic"}
    assert paths(svc.QueryRouteResponse) == {"message_queues.topic"}
    assert paths(svc.QueryAssignmentResponse) == {"assignments.message_queue.topic"}
    assert paths(svc.TelemetryCommand) == {"settings.publishing.topics", "settings.subscription.group",
                                           "settings.subscription.subscriptions.topic",
                                           "recover_orphaned_transaction_command.message.topic",
                                           "verify_message_command.message.topic"}
    for method in svc.DESCRIPTOR.services_by_name["MessagingService"].methods:  # every request names something
        assert resource_paths(method.input_type), method.name


def test_inbound_stores_every_name_and_outbound_gives_the_client_its_names_back():
    request = svc.ReceiveMessageRequest(group=pb.Resource(name="g"),
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="T",
                                                                                        resource_namespace="a")))
    assert inbound(request, "") == "a"
    assert (request.group.name, request.group.resource_namespace) == ("a%g", "")
    assert (request.message_queue.topic.name, request.message_queue.topic.resource_namespace) == ("a%T", "")
    response = svc.ReceiveMessageResponse(message=pb.Message(topic=pb.Resource(name="%DLQ%a%g")))
    outbound(response, "a")
    assert (response.message.topic.name, response.message.topic.resource_namespace) == ("%DLQ%g", "a")
    other = svc.ReceiveMessageResponse(message=pb.Message(topic=pb.Resource(name="b%T")))
    outbound(other, "a")  # not in the client's namespace: its stored name, as a client without one names it
    assert (other.message.topic.name, other.message.topic.resource_namespace) == ("b%T", "")


def test_a_refused_request_is_left_unchanged():
    request = svc.AckMessageRequest(group=pb.Resource(name="g"), topic=pb.Resource(name="x%T"))
    before = request.SerializeToString()
    with pytest.raises(BadRequestError, match="has no '%' of its own"):
        inbound(request, "a")
    assert request.SerializeToString() == before


def test_a_request_without_a_namespace_is_not_touched():
    request = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="t1%T"))])
    assert inbound(request, "") == ""
    assert request.messages[0].topic.name == "t1%T"  # the stored name of T in t1: what an admin tool may send
