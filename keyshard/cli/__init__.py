"""The `keyshard` command line (console script `keyshard.cli:main`).

Layer: the top, beside `keyshard.local`: may import every `coordinator` package and
`consumer_client` (a `keyshard worker` command will run consumer apps). `--help` and the
parser need only a consumer install; server commands import their modules when they run.
"""

from keyshard.cli.main import main

__all__ = ["main"]
