"""A real local Kubernetes control plane for development, tests and the demo.

`binaries` finds or builds the pinned etcd and Kubernetes programs, `pki` makes the key
material, `processes` starts and stops detached processes, and `cluster` ties them together
behind `LocalCluster.up() / down() / status()`.
"""
