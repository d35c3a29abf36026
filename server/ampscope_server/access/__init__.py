"""Who may do what, and how much: principals, tokens, the gate, admission, rate and body limits.

A domain: below the API, above the store.
"""
