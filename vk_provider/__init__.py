"""vk-provider: a Virtual Kubelet provider that turns rented GPU clouds into one Kubernetes node."""

__version__ = "0.1.0"
