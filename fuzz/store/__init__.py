"""Storage: corpus entries (corpus), the failures their known bugs answer for (known), their standalone repro scripts
(repro) and the per-case logs of a run (caselog)."""
