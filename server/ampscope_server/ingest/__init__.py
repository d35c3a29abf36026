"""Ingest: the wire's models, a batch's checks, and storing a batch in one transaction.

A domain: below the API, above the store.
"""
