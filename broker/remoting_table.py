"""The broker's Remoting dispatch table (broker/remoting.py): each request code a RocketMQ 4.x client or mqadmin sends,
and the request family that serves it. A code not here is answered REQUEST_CODE_NOT_SUPPORTED."""

from __future__ import annotations

import types

from rocketraft.remoting.codes import Request
from serverkit.remoting_server import Handler

from .remoting_admin import RemotingAdmin
from .remoting_messages import RemotingMessages
from .remoting_offsets import RemotingOffsets
from .remoting_sessions import RemotingSessions

SESSIONS = {
    Request.HEART_BEAT: RemotingSessions.heartbeat, Request.UNREGISTER_CLIENT: RemotingSessions.unregister,
    Request.GET_CONSUMER_LIST_BY_GROUP: RemotingSessions.consumer_list,
    Request.CHECK_CLIENT_CONFIG: RemotingSessions.check_client_config,
}
MESSAGES = {
    Request.SEND_MESSAGE: RemotingMessages.send, Request.SEND_MESSAGE_V2: RemotingMessages.send,
    Request.SEND_BATCH_MESSAGE: RemotingMessages.send,
    Request.PULL_MESSAGE: RemotingMessages.pull,
    Request.CONSUMER_SEND_MSG_BACK: RemotingMessages.send_back,
    Request.END_TRANSACTION: RemotingMessages.end_transaction,
}
OFFSETS = {
    Request.QUERY_CONSUMER_OFFSET: RemotingOffsets.query_consumer_offset,
    Request.UPDATE_CONSUMER_OFFSET: RemotingOffsets.update_consumer_offset,
    Request.GET_MAX_OFFSET: RemotingOffsets.max_offset, Request.GET_MIN_OFFSET: RemotingOffsets.min_offset,
    Request.SEARCH_OFFSET_BY_TIMESTAMP: RemotingOffsets.offset_by_time,
    Request.LOCK_BATCH_MQ: RemotingOffsets.lock_batch, Request.UNLOCK_BATCH_MQ: RemotingOffsets.unlock_batch,
}
ADMIN = {
    Request.VIEW_MESSAGE_BY_ID: RemotingAdmin.view_by_id,
    Request.QUERY_MESSAGE: RemotingAdmin.query_message,
    Request.UPDATE_AND_CREATE_TOPIC: RemotingAdmin.create_topic,
    Request.DELETE_TOPIC_IN_BROKER: RemotingAdmin.delete_topic,
    Request.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: RemotingAdmin.create_group,
    Request.GET_BROKER_RUNTIME_INFO: RemotingAdmin.runtime_info,
    Request.GET_TOPIC_STATS_INFO: RemotingAdmin.topic_stats,
    Request.GET_CONSUME_STATS: RemotingAdmin.consume_stats,
    Request.GET_TOPIC_CONFIG: RemotingAdmin.topic_config,
}
CODES = frozenset(SESSIONS) | frozenset(MESSAGES) | frozenset(OFFSETS) | frozenset(ADMIN)
assert len(CODES) == len(SESSIONS) + len(MESSAGES) + len(OFFSETS) + len(ADMIN), "a request code served twice"


def handlers(sessions: RemotingSessions, messages: RemotingMessages, offsets: RemotingOffsets,
             admin: RemotingAdmin) -> dict[int, Handler]:
    """Each request code's handler, bound to the family object that serves it."""
    table: dict[int, Handler] = {}
    for family, served in ((sessions, SESSIONS), (messages, MESSAGES), (offsets, OFFSETS), (admin, ADMIN)):
        table.update({code: types.MethodType(function, family) for code, function in served.items()})
    return table
