"""The real components around the overflow flip, fetched, configured and run by the project.

- ``tools``: the pinned programs and their version-keyed cache (``ensure_flip_tools``), built
  by ``gobuild`` (Go module proxy: KWOK, descheduler, kube-state-metrics) or extracted by
  ``debian`` (Prometheus, promtool).
- ``kwok``, ``ksm``, ``prometheus``, ``descheduler``: each one's pure command line and
  configuration beside a runner that starts it as a child process (``child``).
- ``stack.start_flip_components``: all of them next to a ``LocalCluster``, as one handle.
- ``workloads``: manifests of the story (gang training, GPU inference, PDBs);
  ``adminapi``: the small synchronous admin client they are created with;
  ``deployfiles``: where ``deploy/``'s rules and policy are.

Gang scheduling itself needs no program: ``vk_provider_dev.cluster.flags.GANG_SCHEDULING``.
"""
