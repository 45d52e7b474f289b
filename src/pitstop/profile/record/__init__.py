"""The records that cross between the profiled process and pitstop's own: the per-step timeline and its
breakdown, the candidate fixes (``Overrides``) sent in, and what the instrumentation captured of the script.
Nothing here imports torch or another stage."""
