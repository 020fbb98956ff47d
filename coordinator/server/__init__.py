"""The coordinator's listening socket and one session per consumer connection.

Layer: above `coordinator.runtime`, which it feeds; below `keyshard.daemon`.
"""
