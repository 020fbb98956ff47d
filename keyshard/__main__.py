"""`python -m keyshard`: the `keyshard` command, for when the console script is not on PATH."""

import sys

from keyshard.cli.main import main

sys.exit(main())
