"""``pitstop compare``: saved JSON reports of one kind side by side, the first as the baseline
(``reports``: the comparison, a Report itself; ``cli``: the command)."""
