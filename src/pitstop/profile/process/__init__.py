"""How the script runs under the instrumentation in each process: the command as the user typed it, the
bootstrap of a profiled script, a launcher's ranks (``rankhook``, ``rank_start``) and the script's own
``multiprocessing`` children, and ``instrumented`` (install, run, finalize) that every way shares."""
