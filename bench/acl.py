"""What ACL 2.0 costs a call: `python -m bench.acl` (a micro-benchmark, one process, a few seconds).

The work the broker's guard does for one SendMessage when authentication and authorization are on: parse the
`authorization` header, check the HMAC-SHA1 signature and the date-time window, map the call to its needs and
decide against the user's ACL (ACLs of 1, 10 and 1,024 entries, the matching entry last). Not included: the
user lookup (a dict read of the broker's cached view). Best of 5 rounds; microseconds per call.
"""

from __future__ import annotations

import time
import timeit

from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol import auth_acl
from rocketraft.protocol.wire import pb, svc

CALLS_PER_ROUND = 20_000
ROUNDS = 5


def one_call(entries: int):
    user = apb.User(username="alice", password="alice-key", type=apb.NORMAL, status=apb.ENABLE)
    acl = auth_acl.check_acl(apb.Acl(subject="alice", entries=[
        apb.PolicyEntry(resource=f"Topic:t{i}", actions=["Pub"], decision=apb.ALLOW) for i in range(entries - 1)]
        + [apb.PolicyEntry(resource="Topic:orders", actions=["Pub"], decision=apb.ALLOW)]))
    date_time = time.strftime(auth_acl.DATE_TIME_FORMAT, time.gmtime())
    metadata = {"authorization": f"{auth_acl.ALGORITHM} Credential=alice, SignedHeaders=x-mq-date-time, "
                                 f"Signature={auth_acl.sign('alice-key', date_time).hex()}",
                "x-mq-date-time": date_time}
    request = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="orders"))])
    acl = auth_acl.Policy(acl)  # as the broker keeps it (broker/auth_store.AuthView.policy)

    def call() -> None:
        known = auth_acl.authenticate(auth_acl.credential(metadata), user, time.time(), 300_000)
        auth_acl.decide(known, acl, auth_acl.needs_of("SendMessage", request), "127.0.0.1")

    return call


def main() -> None:
    for entries in (1, 10, 1024):
        calls = CALLS_PER_ROUND if entries < 1024 else CALLS_PER_ROUND // 100
        best = min(timeit.repeat(one_call(entries), number=calls, repeat=ROUNDS)) / calls
        print(f"authenticate + authorize one SendMessage, ACL of {entries:>4} entries: {best * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
