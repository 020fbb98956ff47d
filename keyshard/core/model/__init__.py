"""Values every side shares: key -> slot hashing, slot ranges, positions, addresses.

Layer: the bottom. Imports nothing from keyshard; the coordinator, the consumer and
Spark all build on it, which is what keeps their slot numbers and positions identical.
"""
