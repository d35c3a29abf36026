"""Alerts: rules, their evaluation over runs, the outbox and its delivery, settings per project.

A domain: below the API, above the store.
"""
