"""ampscope server: ingest, storage and the read/live API behind the dashboard.

Never imports torch; the wire is defined by `schemas.py` (see docs/contracts.md).
"""

__version__ = "0.1.0"
