"""Put on PYTHONPATH by ``pitstop profile`` around a launcher (torchrun, accelerate launch).

Every Python process the launcher starts imports this at start-up. It first runs the environment's own
``sitecustomize`` (if any), then, in a worker (RANK set, or the launcher's own child), hands over to
``pitstop.profile.process.rank_start``, which runs the worker's script under pitstop's instrumentation. In any
other process it does nothing else.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _mod
    _spec.loader.exec_module(_mod)

if os.environ.get("PITSTOP_RANKS_CONFIG"):
    from pitstop.profile.process.rank_start import activate

    activate()
