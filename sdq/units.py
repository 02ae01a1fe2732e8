"""Byte units, named apart: `MB` is 10**6 bytes (devices, bandwidths, caps given to a
cgroup by a user), `MIB` is 2**20 bytes (the memory plan, RSS, the arena).

Every module that converts bytes imports its unit from here; a figure's name says which
one it is in (`*_mb` fields are MB unless the field's doc says MiB).
"""

MB = 1_000_000
MIB = 1 << 20
KIB = 1 << 10
GIB = 1 << 30
