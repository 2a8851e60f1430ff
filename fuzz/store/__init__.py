"""Storage: corpus entries (corpus), their standalone repro scripts (repro) and the per-case logs of a run (caselog)."""
