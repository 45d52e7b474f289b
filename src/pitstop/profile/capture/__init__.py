"""What runs in the user's process while the script trains: the hooks and the patches they install
(loaders, models, torch calls, syncs), the step clock, device timers, the watchdog and its stacks, facts
about the model and settings, and the ``--trace`` window."""
