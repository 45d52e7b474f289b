"""``fix --apply`` for the distributed fixes (``pitstop.fix.dist``), each named by its registry entry.

- static_graph: ``static_graph=True`` on the ``DistributedDataParallel(...)`` call the profile recorded;
- threads: its component's edit (``pitstop.recipes.threads``, through ``apply.apply_component``);
- no_sync: ``no_sync_every(k)`` first in the script's main (the step component's ``EDIT_LINE``,
  ``pitstop.recipes.step``; ``pitstop.train.no_sync_every``), the same
  mechanism fix measured, which also keeps an uneven last accumulation's gradients all-reduced. A source
  edit of the loop itself (``with model.no_sync()`` around all but the k-th backward) would need the
  loop's own counter and would leave such a step with one rank's local gradient.
"""

from __future__ import annotations

from pitstop.fix.apply import Site, Unplaced, insert_first_line, script_file
from pitstop.fix.dist import ddp_location
from pitstop.fix.patch import keyword_edit
from pitstop.recipes import step

DDP_NAMES = ("DistributedDataParallel", "DDP")


def apply_static_graph(site: Site) -> None:
    fe, line = site.file_at(ddp_location(site.config), "static_graph")
    for name in (*DDP_NAMES, None):
        try:
            fe.text = keyword_edit(fe.text, line, {"static_graph": True}, name)
            break
        except ValueError:
            continue
    else:
        raise Unplaced(f"static_graph: no DistributedDataParallel(...) call at {fe.path}:{line}")
    fe.changes["static_graph"] = True


def apply_no_sync(site: Site) -> None:
    k = site.overrides.get("ddp_no_sync")
    if not k:
        raise Unplaced("no_sync: the fix recorded no accumulation count")
    fe = script_file(site)
    insert_first_line(fe, step.EDIT_LINE.format(k=int(k)), step.EDIT_IMPORT)
    fe.changes["no_sync"] = int(k)
