// The admin calls of HBase 2.x's Thrift2 gateway (THBaseService) that hqueue
// uses: create a table pre-split at partition boundaries, truncate it keeping
// its splits. Thrift1 (which happybase speaks) has neither.
//
// This is a subset of HBase's own thrift2/hbase.thrift: same service name,
// method names, field ids and types, so it is wire-compatible with a real
// HBase 2.x `hbase thrift2` server. Loaded at run time by thriftpy2.

namespace py hbase2_admin

enum TDurability {
  USE_DEFAULT = 0,
  SKIP_WAL = 1,
  ASYNC_WAL = 2,
  SYNC_WAL = 3,
  FSYNC_WAL = 4
}

enum TCompressionAlgorithm {
  LZO = 0,
  GZ = 1,
  NONE = 2,
  SNAPPY = 3,
  LZ4 = 4,
  BZIP2 = 5,
  ZSTD = 6
}

struct TTableName {
  1: optional binary ns
  2: required binary qualifier
}

struct TColumnFamilyDescriptor {
  1: required binary name
  6: optional TCompressionAlgorithm compressionType
  10: optional i32 maxVersions
  13: optional i32 timeToLive
}

struct TTableDescriptor {
  1: required TTableName tableName
  2: optional list<TColumnFamilyDescriptor> columns
  4: optional TDurability durability
}

exception TIOError {
  1: optional string message
}

service THBaseService {
  bool tableExists(1: TTableName tableName) throws (1: TIOError io)
  void createTable(1: required TTableDescriptor desc, 2: optional list<binary> splitKeys) throws (1: TIOError io)
  void truncateTable(1: required TTableName tableName, 2: required bool preserveSplits) throws (1: TIOError io)
}
