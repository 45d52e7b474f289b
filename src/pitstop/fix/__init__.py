"""``pitstop fix``: fixes proven by re-running the user's script with each one injected, and written into
the script by ``fix --apply``.

    from pitstop.fix.fix import run_fix, fix_report          # re-run a script with candidate fixes injected
    from pitstop.fix.apply import apply_all                  # write the patches of the fixes that helped

Modules import torch lazily where they can so ``pitstop --help`` stays fast. See docs/tune.md.
"""
