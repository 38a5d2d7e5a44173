"""Configuration of the Kubernetes-cluster adapter (``type: kubernetes``).

``expose`` says how a declared container port of a remote pod is reached from cluster A
(``endpoints``). Its default is ``none``, reporting no endpoint, because every other mode is a
claim only the operator can make or a cost only the operator can accept:

- ``flat`` claims that A reaches B's pod IPs. Where it does not (the usual case: two clusters,
  two private pod networks), A's Services would send traffic nowhere; where both use the same
  private range (10.244.0.0/16 is many installers' default), to an unrelated pod of A that
  happens to have that IP, which is worse than not reaching it.
- ``node-port`` creates a Service per launch in B and opens a port on every node of B;
  ``load-balancer`` creates a cloud load balancer per launch, a billable object. Both need the
  ``services`` rights in B (``remote``), which an operator who set nothing has not granted.

So nothing is exposed until the operator opts in, and a Service whose selector would miss these
pods says so (``PortNotExposed`` Warnings in A) instead of failing silently.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from vk_provider.sdk import CloudProviderSettings, SecretRef

Expose = Literal["none", "flat", "node-port", "load-balancer"]
NodeAddressType = Literal["ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"]


class KubernetesProviderConfig(CloudProviderSettings):
    """Another Kubernetes cluster: pods run in a namespace there."""

    type: Literal["kubernetes"]
    kubeconfig: SecretRef = Field(description="Kubeconfig of the remote cluster, by reference.")
    namespace: str = Field("vk-provider-workloads", description="Remote namespace for pods.")
    gpu_model: str | None = Field(None, description="Canonical GPU model of the remote nodes.")
    gpu_price_per_hour: float = Field(0, ge=0, description="Price per GPU per hour.")
    cpu_price_per_hour: float = Field(0, ge=0, description="Price per vCPU per hour.")
    expose: Expose = Field(
        "none",
        description="Where cluster A reaches a remote pod's declared ports. none: not reported "
        "(its Services leave it out). flat: at the remote pod's IP and the container port, "
        "when the operator knows A routes to B's pod network. node-port: a NodePort Service in "
        "B per pod, reached at one Ready node's address (node_address_types) and the node "
        "port B assigned. load-balancer: a LoadBalancer Service in B per pod (billable), "
        "reached at its ingress IP or hostname and the container port, once B assigned one.",
    )
    node_address_types: list[NodeAddressType] = Field(
        default_factory=lambda: list[NodeAddressType](("ExternalIP", "InternalIP")),
        min_length=1,
        description="expose: node-port: which address of a node is reported, in order of "
        "preference across B's Ready nodes (the first type any of them has wins).",
    )
    node_selector: str = Field(
        "type!=virtual-kubelet",
        description="expose: node-port: a label selector for the nodes of B whose addresses "
        "may be reported. The default leaves out virtual nodes, which run no kube-proxy and so "
        "do not serve node ports; empty: every node.",
    )
    service_annotations: dict[str, str] = Field(
        default_factory=dict,
        description="expose: node-port or load-balancer: annotations of each Service the "
        "adapter creates in B (a cloud's load-balancer settings, e.g. an internal one).",
    )

    @field_validator("node_address_types")
    @classmethod
    def _distinct(cls, value: list[NodeAddressType]) -> list[NodeAddressType]:
        if len(set(value)) != len(value):
            raise ValueError("each address type may be named once")
        return value
