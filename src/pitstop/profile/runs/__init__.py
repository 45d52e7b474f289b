"""pitstop's own process: start the script (``runner``) or a launch and its ranks (``ranks``), supervise it,
read what it measured into a ``RunResult`` and build its report, merged across ranks or children."""
