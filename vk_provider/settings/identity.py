"""Which identity the agent uses for the Kubernetes API (``identity:``).

- ``serviceAccount`` (default): the credentials it is started with (in-cluster ServiceAccount
  or ``--kubeconfig``) for every call; its RBAC role decides what it may do.
- ``node``: those credentials only bootstrap a node identity, as kubelet TLS bootstrap does:
  a CertificateSigningRequest for ``system:node:<node.name>`` in ``system:nodes`` (signer
  ``kubernetes.io/kube-apiserver-client-kubelet``), approved and signed by the cluster, then
  renewed before it expires. Every call a kubelet makes goes out as the node, so the Node
  authorizer and NodeRestriction confine it to its own node's pods and what they reference;
  writes of the node object's labels and taints (forbidden to a node) stay with the
  bootstrap credentials.

Invariant: the renewal point is strictly inside the certificate's lifetime, so a renewal that
fails still has time to be retried before the old certificate expires.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vk_provider.settings.secrets import Strict

IdentityMode = Literal["serviceAccount", "node"]


class IdentityConfig(Strict):
    mode: IdentityMode = Field(
        "serviceAccount",
        description="serviceAccount: the starting credentials for everything; node: a client "
        "certificate for system:node:<node.name> from a CertificateSigningRequest.",
    )
    certificate_seconds: int = Field(
        86400,
        ge=600,
        le=31_536_000,
        description="Lifetime asked for the node certificate (the CSR's expirationSeconds; the "
        "signer may shorten it, never lengthen it).",
    )
    renew_fraction: float = Field(
        0.7,
        ge=0.1,
        le=0.9,
        description="Renew once this fraction of the time from receiving the certificate to "
        "its expiry has passed.",
    )
    approval_timeout_seconds: float = Field(
        120,
        gt=0,
        le=3600,
        description="How long to wait for the CSR to be approved and signed before failing.",
    )

    @property
    def node(self) -> bool:
        return self.mode == "node"
