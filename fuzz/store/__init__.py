"""Storage: corpus entries (corpus), the failures their known bugs answer for (known), running them again (replay,
parallel_replay), their standalone repro scripts (repro) and the per-case logs of a run (caselog)."""
