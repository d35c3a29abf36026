"""Storage, the bottom layer: models, sessions, every SQL statement, the packed formats.

The repositories take a `Session` and never commit; the packing and the rollups they keep are
pure. Imports no other layer of the package.
"""
