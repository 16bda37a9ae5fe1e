"""What both ends of hqueue's Thrift connections share: the IDL, the
conversions between Thrift structs and hqueue objects, frame checks, and
the threaded Thrift server (used by hqueue servers and by subscribers)."""
