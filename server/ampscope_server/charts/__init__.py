"""The run page's charts: series, heatmaps, events, skip rates, optimizers, reduced for plotting.

A domain: below the API, above the store.
"""
