"""The pure core: models, errors, the provider contract and every decision.

Nothing here does I/O, reads a clock of its own (clocks are passed in) or imports asyncio,
HTTP or Kubernetes client libraries; import-linter keeps it so (``.importlinter``). Models and
errors are what adapters speak; ``podview`` parses a pod once; ``workload`` turns it into a
``WorkloadSpec``; ``placement``, ``budget``, ``breaker``, ``lifecycle``, ``reconcile``,
``podstatus`` and ``node`` decide.
"""
