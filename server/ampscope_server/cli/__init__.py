"""The `ampscope` command: serving, administration, alerts.

The top layer: it may import the API and every domain.
"""
