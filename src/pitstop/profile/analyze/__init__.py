"""Measurements -> Findings: the rules and their kit, the distributed and contention rules, the judging of
probe and in-run predictions by their intervals, stalls, the headline and the summary. Pure functions:
nothing here measures or prints."""
