import sys

from pitstop.cli import main

sys.exit(main())
