"""Where users train: the in-process ``Profiler``, and callbacks for Lightning and HF Trainer.

``pitstop.integrations.lightning`` and ``pitstop.integrations.transformers`` import their framework only
when imported themselves; pitstop needs neither.
"""

from pitstop.integrations.profiler import Profiler

__all__ = ["Profiler"]
