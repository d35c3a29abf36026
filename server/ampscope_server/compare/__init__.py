"""Comparing two runs: aligned series, the first divergence, the layers that differ.

A domain: below the API, above the store.
"""
