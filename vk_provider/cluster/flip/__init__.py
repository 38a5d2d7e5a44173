"""The real components around the overflow flip, fetched, configured and run by the project.

``tools`` pins and caches the programs (KWOK, the descheduler, kube-state-metrics from the
Go module proxy; Prometheus from Debian); ``kwok``, ``ksm``, ``prometheus`` and
``descheduler`` hold each one's pure command lines and configuration files beside a runner
that starts it as a child process (``child``) next to a ``LocalCluster``.
"""
