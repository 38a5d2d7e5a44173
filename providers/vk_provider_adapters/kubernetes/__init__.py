"""The adapter for another Kubernetes cluster (``type: kubernetes``)."""
