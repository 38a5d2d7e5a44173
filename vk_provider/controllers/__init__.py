"""Loops and effects: the work queue, the pod controller (an executor of the pure
lifecycle's actions), the launcher (the one create path), reconciliation, the instance
tracker, the offer book, the guarded provider and the node controller. No FastAPI, no typer:
what they report leaves through ``observer``.
"""
