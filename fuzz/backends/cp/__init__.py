"""Context parallelism as a backend family: the adapter, its repro writer, the engines (TE comm types, torch ring
attention), sharding, the rank pool and its workers."""
