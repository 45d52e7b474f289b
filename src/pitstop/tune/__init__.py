"""``pitstop tune``: settings measured on the user's data (``pitstop fix`` lives in ``pitstop.fix``).

    from pitstop.tune.loader import tune_loader             # fastest DataLoader settings, measured
    from pitstop.tune.batch_size import find_batch_size     # largest batch that fits (CUDA / CPU budget)
    from pitstop.tune.lr import lr_range_test               # Smith's LR range test, state restored

Modules import torch lazily where they can so ``pitstop --help`` stays fast. See docs/tune.md.
"""
