"""attnfuzz: a property-based differential fuzzer for attention kernels, graded against a float64 oracle.

The package is built in layers, and imports only go down them (tests/test_layers.py checks it, imports inside
functions included, and that no modules import each other in a circle):

    front ends    attnfuzz.cli, attnfuzz.plugin, attnfuzz.__main__, attnfuzz.test_fuzz (`pytest fuzz`)
    campaign      attnfuzz.campaign: the supervisor and its lanes
    tools/report  attnfuzz.tools (shrink, versiondiff, crosscheck, timebox, bugreport, bugwords), attnfuzz.report
                  (build, plots, coverage, triage, catalog, table)
    store         attnfuzz.store: corpus entries, known bugs, replay, repro scripts, case logs
    engine        attnfuzz.engine: harness, tally, hooks, compiled_search, isolate, poison, profiles, interrupt, and
                  options
                  (every option several front ends share, declared once; the CLI adds --NAME, the plugin
                  --attnfuzz-NAME)
    backends      attnfuzz.backends: the Backend protocol (base), the registry, shared layout and source helpers,
                  bring-your-own kernels (custom), and one folder per family: sdpa, flex, flash, te, cp
    oracles       attnfuzz.oracles: the float64 reference, tolerance, grading, verdicts
    strategies    attnfuzz.strategies: the case language and the Hypothesis strategies

Inside a family the repro writer sits below the adapter: what both need lives in a module of its own below them
(flex/mods.py, te/call.py, flash/common.py), and the adapter imports the writer for its `repro_source`.
A new backend is an adapter module in a family folder and its name in backends.ADAPTER_MODULES.
"""
