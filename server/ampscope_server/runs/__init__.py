"""Runs: their list, details, steps and lifecycle, and the read API's schemas and JSON floats.

A domain: below the API, above the store.
"""
