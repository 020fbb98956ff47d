"""The `keyshard` command line (console script `coordinator.cli:main`).

Layer: the top, beside `coordinator.local`: may import every `coordinator` package and
`consumer_client` (a `keyshard worker` command will run consumer apps). `--help` and the
parser need only a consumer install; server commands import their modules when they run.
"""

from coordinator.cli.main import main

__all__ = ["main"]
