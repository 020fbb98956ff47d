"""Only the optional C extension lives here; the metadata is in pyproject.toml.

`keyshard.consumer_client._datapath._fastpath` is the C fast path of the consumer's
per-record loop. It is optional: without a compiler the install goes on and the consumer
uses its Python loop.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "keyshard.consumer_client._datapath._fastpath",
            ["consumer_client/_datapath/_fastpath.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
