"""Push subscriptions (SPEC C5, C6): the server reads each partition past a
subscriber's checkpoint and pushes the messages to its listener.

* ``registry.py``: a subscriber's registration (topics, partitions,
  checkpoints, address) and the registry interface; ``zk_registry.py``
  keeps registrations in ZooKeeper (presence by ephemeral nodes),
  ``store_registry.py`` in the store (presence by heartbeats).
* ``service.py``: adding, deleting and describing subscribers, moving
  their checkpoints.
* ``delivery.py``: the workers that read, push and checkpoint, one per
  (subscriber, owned partition).
* ``local.py``: the same for a store opened in this process (no server).
* ``listener.py``: the subscriber's side: :class:`Subscriber`, which listens
  for pushes and hands them to a :class:`MessageListener`.
"""
