"""Wiring: the provider ``registry``, the ``agent`` built from the configuration, and the
``supervisor`` that runs its root tasks.
"""
