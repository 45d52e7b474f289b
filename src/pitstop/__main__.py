from pitstop.cli import entry

entry()
