"""Every key layout, at the bottom of the house: what storage backends store
without knowing what it means.

* message rows: ``pid (2) + timestamp (8) + sequence (2) + topic``
  (hqueue/message.py, with MessageID and its codec);
* ``timers.py``: pending timers, in each partition's timer range ``pid | 0x8000``;
* ``index.py``: the per-topic index's entries, under ``0xFFFF``;
* ``groups.py``: consumer groups' definitions and progress (metadata keys).
"""
