"""The one error type of the local control plane: its message says what is wrong and what to do."""


class ClusterError(RuntimeError):
    """A local-cluster operation failed for a reason a person can act on."""
