"""Tools over one finding: shrink it, diff it across versions, cross-check it on other backends, write the bug report."""
