"""Analysis of what runs left behind: the campaign report (build, plots, coverage), known-bug triage and the catalog of findings."""
