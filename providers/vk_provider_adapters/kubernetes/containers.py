"""The containers of the remote pod, built from a ``WorkloadSpec`` (pure).

Every app container and every init container of the workload, in order, each with its own
image, command, args, workingDir, ports, env and probes; a native sidecar (an init container
with ``restart_policy="Always"``) keeps ``restartPolicy: Always``.

Env: a value that came from a Secret (``EnvVar.secret``) is a ``secretKeyRef`` into the
launch's Secret, under the key ``names.secret_keys`` gives that (container, variable); every
other value is written as is. Probes are translated back into Kubernetes' JSON (exec,
httpGet, tcpSocket, grpc) with all five timing fields, so B's kubelet probes exactly what A's
would have.

Invariants: pure; no secret value is ever written into a container; ``container_json``
raises ``InvalidSpec`` only for a container without an image (B would refuse it, less
clearly).
"""

from __future__ import annotations

from collections.abc import Mapping

from vk_provider.sdk import ContainerSpec, InvalidSpec, Probe

JSON = dict[str, object]
SecretKeys = Mapping[tuple[str, str], str]  # (container, variable) -> key in the Secret


def probe_json(probe: Probe) -> JSON:
    """A ``Probe`` as Kubernetes writes it, every timing field included."""
    action: JSON
    if probe.kind == "exec":
        action = {"exec": {"command": list(probe.command)}}
    elif probe.kind == "http":
        get: JSON = {"path": probe.path, "port": probe.port, "scheme": probe.scheme}
        if probe.host:
            get["host"] = probe.host
        if probe.headers:
            get["httpHeaders"] = [{"name": name, "value": value} for name, value in probe.headers]
        action = {"httpGet": get}
    elif probe.kind == "tcp":
        action = {"tcpSocket": {"port": probe.port} | ({"host": probe.host} if probe.host else {})}
    else:
        grpc: JSON = {"port": probe.port}
        if probe.grpc_service:
            grpc["service"] = probe.grpc_service
        action = {"grpc": grpc}
    return action | {
        "initialDelaySeconds": probe.initial_delay_seconds,
        "periodSeconds": probe.period_seconds,
        "timeoutSeconds": probe.timeout_seconds,
        "successThreshold": probe.success_threshold,
        "failureThreshold": probe.failure_threshold,
    }


def _env(container: ContainerSpec, keys: SecretKeys, secret_name: str | None) -> list[JSON]:
    env: list[JSON] = []
    for var in container.env:
        if not var.secret:
            env.append({"name": var.name, "value": var.value})
            continue
        if secret_name is None:
            raise ValueError("secret env values need a Secret")  # a bug, not a spec error
        ref = {"name": secret_name, "key": keys[(container.name, var.name)]}
        env.append({"name": var.name, "valueFrom": {"secretKeyRef": ref}})
    return env


def container_json(
    container: ContainerSpec,
    *,
    path: str,
    keys: SecretKeys,
    secret_name: str | None,
    resources: JSON,
) -> JSON:
    """One container of the remote pod; ``path`` (``spec.containers[0]``) names it in errors."""
    if not container.image.strip():
        raise InvalidSpec("a container needs an image", field=f"{path}.image")
    body: JSON = {"name": container.name, "image": container.image}
    if container.restart_policy:
        body["restartPolicy"] = container.restart_policy
    if container.command:
        body["command"] = list(container.command)
    if container.args:
        body["args"] = list(container.args)
    if container.working_dir:
        body["workingDir"] = container.working_dir
    env = _env(container, keys, secret_name)
    if env:
        body["env"] = env
    if container.ports:
        body["ports"] = [
            {"containerPort": p.container_port, "protocol": p.protocol}
            | ({"name": p.name} if p.name else {})
            for p in container.ports
        ]
    body["resources"] = resources
    for field, probe in (
        ("startupProbe", container.startup_probe),
        ("readinessProbe", container.readiness_probe),
        ("livenessProbe", container.liveness_probe),
    ):
        if probe is not None:
            body[field] = probe_json(probe)
    return body
