"""The downloads: a run as JSON or CSV, page by page, and its self-contained HTML report.

A domain: below the API, above the store.
"""
