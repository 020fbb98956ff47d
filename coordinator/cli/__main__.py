"""`python -m coordinator.cli`: how the demo and the tests start daemons and workers."""

import sys

from coordinator.cli.main import main

sys.exit(main())
