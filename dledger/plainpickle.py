"""Pickle restricted to plain data: how dledger reads every pickle that arrives from a peer or from a store.

pysyncobj frames its Raft messages and its commands as pickles, and a pickle that names a global (a class or a
function) makes the reader call it: whoever can reach a Raft port could run code on the replica. A Raft message
or a stored command is plain data (dicts, lists, tuples, strings, bytes, numbers, booleans, None), so a pickle
that names any global is refused before anything is called. Without globals a pickle has no callable to call:
REDUCE, BUILD and the object opcodes fail, and extension codes also go through find_class.

The Raft password (authenticated encryption) still decides who may talk to a replica; this decides what even an
authenticated peer, or a damaged store, can make the reader do.
"""

from __future__ import annotations

import io
import pickle


class RefusedPickleError(pickle.UnpicklingError):
    """A pickle named a global: it is not plain data, and nothing in it was called."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise RefusedPickleError(f"refused a pickle that names {module}.{name}: dledger reads plain data only "
                                 "(a Raft message or a stored command never names a class or a function)")

    def persistent_load(self, pid):
        raise RefusedPickleError("refused a pickle with a persistent id: dledger reads plain data only")


def loads(data: bytes | bytearray | memoryview) -> object:
    return _PlainUnpickler(io.BytesIO(data)).load()


def load(file) -> object:
    return _PlainUnpickler(file).load()
