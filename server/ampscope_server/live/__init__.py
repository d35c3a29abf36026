"""Live updates: the hub that tells sockets a run has new rows, across processes on Postgres.

A domain: below the API, above the store.
"""
