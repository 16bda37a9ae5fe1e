"""Consumer groups (SPEC X3): members share a queue's messages, ack, nack and retry.

* ``state.py``: a group's definition and its progress over one partition
  (cursors, acks, leases, retries) and how live members share partitions;
  nothing there reads or writes the store.
* ``service.py``: the group service each partition's owner runs (receive,
  ack, nack, dead-letter, describe, positions), attached to the engine.

The client's handle is :class:`hqueue.consumer.Consumer`; where the state is
kept in the store is hqueue/keys/groups.py.
"""
