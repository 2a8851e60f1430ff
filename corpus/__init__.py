"""The shipped corpus: minimal reproducers of known bugs (JSON entries and standalone repro scripts), replayed by
`pytest corpus` and read as known bugs by every run."""
