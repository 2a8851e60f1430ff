"""torch flex_attention, eager and compiled: the adapter and its repro writer."""
