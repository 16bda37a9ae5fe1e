"""HBase storage through its Thrift (1) gateway, with happybase.

Layout (SPEC C1):

* one table per queue, ``<prefix>q_<queue>``, column family ``message``
  (``max_versions=1``, ``time_to_live`` = the queue's TTL, compression
  configurable); row = the 12-byte rowkey, qualifier = topic, value = payload;
* a meta table ``<prefix>meta``, family ``q``, one row per queue holding its
  :class:`~hqueue.config.QueueInfo` as JSON, so every hqueue process pointed
  at the same HBase sees the same queues.

What HBase's Thrift1 API can and cannot do, and what this backend does:

* Pre-split: Thrift1 ``createTable`` takes no split keys. With HBase 2.x,
  name its Thrift2 gateway in the URL (``admin=host:9091``, the server
  started by ``hbase thrift2``) and tables are created pre-split at
  partition boundaries, ``partitionsPerRegion`` partitions a region
  (:func:`split_keys`), through ``THBaseService.createTable``. Without it
  (HBase 1.x, or no Thrift2 gateway) a table starts as one region and HBase
  splits it as it grows.
* Durability: ``SKIP_WAL`` sends mutations with ``writeToWAL=false``.
  ``ASYNC_WAL`` is a table attribute in HBase: it is set through Thrift2
  when ``admin=`` is given; Thrift1 alone cannot set it, so such a table
  uses HBase's default (SYNC_WAL).
* Atomicity: ``mutateRows`` is atomic per row, not per batch. A batch that
  fails part-way may leave a prefix of its rows written (and the put is
  reported failed: at least once, never lost). Every row of one put lies in
  one partition, so usually in one region.
* Truncate: with ``admin=``, Thrift2 ``truncateTable(preserveSplits=true)``;
  Thrift1 has no truncate, so without it the table is disabled, deleted and
  created again with the same families (the info and ID floor are kept).
* Deletes and puts of one key: HBase's delete marker hides every version
  stamped at or before it, a put that comes later in the same millisecond
  of HBase's clock included. Message and timer cells are never written
  again once deleted; metadata keys may be (a queue dropped and created
  again, a subscription unregistered and registered), so a metadata delete
  waits ``DELETE_SETTLE`` (1.5 ms) once HBase acknowledged it.
* Counting: no cheap count exists over Thrift; ``estimate_count`` is None.
* TTL: HBase hides and drops expired cells itself. What it cannot do is
  keep IDs from going back (SPEC C2): once a partition's last rows expire,
  nothing in the table says how high its IDs went, and a restart with a
  clock that went back would give lower ones. So a housekeeping thread
  remembers each TTL queue's newest ID (the ID floor, in the meta table)
  at least twice per TTL, before HBase can hide it.

Errors from Thrift, sockets and HBase are wrapped in :class:`StorageError`
(``raise … from e``); idempotent reads are retried once on a fresh
connection, since the pool drops a connection that failed.
"""

from .cells import StorageUnavailable, split_keys
from .storage import HBaseStorage

__all__ = ["HBaseStorage", "StorageUnavailable", "split_keys"]
