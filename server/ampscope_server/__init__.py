"""ampscope server: ingest, storage and the read/live API behind the dashboard.

Never imports torch; the wire is defined by `ingest.wire` (docs/contracts.md). The layers and
what each package holds: docs/layout.md.
"""

__version__ = "0.1.0"
