"""The Lambda Cloud adapter (``type: lambda``)."""
