"""The faces the agent serves: the REST API (``rest``, ``schemas``), the kubelet API
(``kubelet``, ``kubelet_auth``, ``tls``), Prometheus metrics (``metrics``) and the read-only
``view`` of the running agent they all read from.
"""
