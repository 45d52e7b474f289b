"""fix on launcher commands: the thread-split candidate from distributed.threads."""

from __future__ import annotations

from pitstop.findings import Finding, Severity
from pitstop.fix import fix, fix_dist


def test_thread_split_candidate_gives_each_local_rank_its_share(monkeypatch):
    monkeypatch.setattr(fix_dist, "usable_cores", lambda: 8)
    f = Finding(id="distributed.threads", severity=Severity.WARN, title="t")
    kinds = fix.kinds_from_findings([f])
    assert kinds == [("threads", "distributed.threads")]
    (c,) = fix.build_candidates(kinds, {"local_world_size": 2}, fix.FixConfig())[0]
    assert c.overrides.num_threads == 4 and c.name == "4 threads per rank"
    (one,) = fix.build_candidates(kinds, {"local_world_size": 16}, fix.FixConfig())[0]
    assert one.overrides.num_threads == 1
