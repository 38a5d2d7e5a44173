"""How the Kubernetes adapter reaches cluster B: its kubeconfig, loaded by kubernetes_asyncio.

The kubeconfig (text, resolved from the configuration's ``SecretRef``) is read by
kubernetes_asyncio's own loader — ``KubeConfigLoader(...).load_and_set(Configuration())`` — so
context selection (``current-context`` unless one is named), the server, the CA
(``certificate-authority-data`` or ``certificate-authority``, or ``insecure-skip-tls-verify``),
the client certificate and key (``-data`` or file) and the bearer token (``token`` or
``tokenFile``) mean here exactly what they mean to ``kubectl``'s Python client; relative paths
are read beside a ``file:`` kubeconfig. From the ``Configuration`` it produced this module
builds what httpx needs (``ClusterAccess``): the server URL, the ``Authorization`` header and
an ``ssl.SSLContext`` made as kubernetes_asyncio's own REST client makes it.

Refused before the loader runs, as before the library was used: ``exec`` and
``auth-provider`` plugins (the loader would run a command, or call an identity provider,
inside the agent with the agent's rights and no timeout of ours) and basic auth
(``username``). Use a ServiceAccount token or a client certificate. ``tls-server-name`` and
``proxy-url`` are ignored.

Key material on disk: the loader hands certificates to ``ssl`` as files and writes ``-data``
into temporary ones. It is given a private directory (0700, files 0600); once the SSL context
holds the key in memory, the directory is removed and the loader's file cache forgets it, so
no key is left on disk and a later load writes fresh files.

Invariants: a fresh ``Configuration`` is loaded, never the library's default one, so the
agent's own client (``vk_provider.kube``) is untouched; every failure is a ``KubeconfigError``
(a ``ConfigError``) naming the field or file, never quoting the document, which holds
credentials.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import shutil
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader

from vk_provider.sdk import ConfigError, check_credential_url, parse_yaml
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig

_UNSUPPORTED = ("exec", "auth-provider", "username")
_MISSING_FILE = "File does not exists: "  # kubernetes_asyncio's wording


class KubeconfigError(ConfigError):
    """The kubeconfig cannot be used; the message names the field, never a value."""


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    """How to reach cluster B: the server and the credentials of one kubeconfig context."""

    server: str
    context: str = ""
    token: str | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    # The credentials, for redaction: the token and the client key (PEM).
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings: B's CA (or the system's), and the client certificate if any."""
        return self.tls if self.tls is not None else ssl.create_default_context()


def load_kubeconfig(
    text: str,
    *,
    base_dir: Path | None = None,
    context: str | None = None,
    allow_insecure_loopback: bool = False,
) -> ClusterAccess:
    """The ``ClusterAccess`` of ``context`` (default: ``current-context``) in ``text``.

    The server must be https (a credential goes with every request): plain http only to a
    loopback host and only when ``allow_insecure_loopback`` says so.
    """
    try:
        document = parse_yaml(text, name="kubeconfig")  # bounded: depth, values
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is None:  # past a bound: the message names the limit and the line, no content
            raise KubeconfigError(f"kubeconfig: {exc}") from None
        raise KubeconfigError(f"kubeconfig: not valid YAML (line {mark.line + 1})") from None
    if not isinstance(document, dict):
        raise KubeconfigError("kubeconfig: expected a mapping at the top level")
    if context is None and not document.get("current-context"):
        raise KubeconfigError("kubeconfig: 'current-context' is not set")
    scratch = Path(tempfile.mkdtemp(prefix="vk-kube-"))
    try:
        # The loader is async (it can run exec plugins, which are refused): run it on a loop
        # of its own, so that this works inside the agent's running loop too.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            access = pool.submit(asyncio.run, _load(document, context, base_dir, scratch)).result()
    finally:
        _forget_files(scratch)
    try:
        check_credential_url(access.server, allow_insecure_loopback=allow_insecure_loopback)
    except ValueError as exc:
        raise KubeconfigError(
            f"kubeconfig: the cluster of context {access.context!r}: {exc}"
        ) from None
    return access


async def _load(
    document: dict[str, Any], context: str | None, base_dir: Path | None, scratch: Path
) -> ClusterAccess:
    try:
        loader = KubeConfigLoader(
            config_dict=document,
            active_context=context,
            config_base_path=str(base_dir) if base_dir is not None else "",
            temp_file_path=str(scratch),
        )
    except (AssertionError, TypeError, ConfigException) as exc:  # it asserts some of them
        raise KubeconfigError(_missing(document, context, exc)) from None
    chosen: Any = loader.current_context  # the loader asserted it exists
    name = str(chosen["name"])
    user_name, user = _user(document, chosen)
    who = f"users[{user_name!r}]"
    for unsupported in _UNSUPPORTED:
        if unsupported in user:
            raise KubeconfigError(
                f"kubeconfig: {who}.{unsupported} is not supported; use a token or a client "
                "certificate"
            )
    configuration = Configuration()
    try:
        await loader.load_and_set(configuration)
    except ConfigException as exc:
        text = str(exc)
        if text.startswith(_MISSING_FILE):
            raise KubeconfigError(
                f"kubeconfig: cannot read {text.removeprefix(_MISSING_FILE)} (no such file)"
            ) from None
        raise KubeconfigError(f"kubeconfig: {text}") from None
    except (ValueError, TypeError, OSError) as exc:  # base64 and file errors name no value
        raise KubeconfigError(f"kubeconfig: {who}: {type(exc).__name__}") from None
    server = configuration.host
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig: the cluster of context {name!r}: server is not a URL")
    if bool(configuration.cert_file) != bool(configuration.key_file):
        raise KubeconfigError(f"kubeconfig: {who} needs both a client certificate and its key")
    header = configuration.api_key.get("BearerToken")
    token = header.removeprefix("Bearer ").strip() if isinstance(header, str) else None
    secrets = [token] if token else []
    key = _key_text(configuration.key_file)
    if key:
        secrets.append(key)
    return ClusterAccess(
        server=server.rstrip("/"),
        context=name,
        token=token or None,
        tls=_ssl_context(configuration, name) if server.startswith("https://") else None,
        secrets=tuple(secrets),
    )


def _key_text(path: object) -> str | None:
    """The client key the loader found (PEM), to redact; None when there is none (an unusable
    one is reported by ``ssl`` when the context is built)."""
    if not isinstance(path, str) or not path:
        return None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return Path(path).read_text().strip()
    return None


def _user(document: dict[str, Any], chosen: Any) -> tuple[str, dict[str, Any]]:
    """The name and body of the chosen context's user, found as the loader finds it."""
    user_name = ConfigNode("context", chosen["context"]).safe_get("user")
    users = ConfigNode("kube-config", document).safe_get("users")
    if not user_name or not isinstance(users, list):
        return str(user_name or ""), {}
    entry = ConfigNode("users", users).get_with_name(user_name, safe=True)
    body = entry.safe_get("user") if entry is not None else None
    return str(user_name), body.value if isinstance(body, ConfigNode) else dict(body or {})


def _missing(document: dict[str, Any], context: str | None, exc: Exception) -> str:
    """Why the loader could not select the context: which entry is missing."""
    name = context or document.get("current-context")
    contexts = ConfigNode("kube-config", document).safe_get("contexts")
    found = isinstance(contexts, list) and any(
        isinstance(c, dict) and c.get("name") == name for c in contexts
    )
    if not found:
        return f"kubeconfig: no entry {name!r} in 'contexts'"
    if isinstance(exc, ConfigException):
        return f"kubeconfig: {exc}"
    return f"kubeconfig: the cluster of context {name!r} is not in 'clusters'"


def _ssl_context(configuration: Any, context: str) -> ssl.SSLContext:
    """As kubernetes_asyncio's REST client builds it (``client/rest.py``)."""
    try:
        tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    except (ssl.SSLError, ValueError, OSError):
        raise KubeconfigError(
            f"kubeconfig context {context!r}: the certificate authority is not PEM"
        ) from None
    if configuration.cert_file:
        try:
            tls.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
        except (ssl.SSLError, OSError):
            raise KubeconfigError(
                "kubeconfig: the client certificate and key cannot be loaded together"
            ) from None
    if not configuration.verify_ssl:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    return tls


def _forget_files(scratch: Path) -> None:
    """Remove the loader's temporary files of this load, and its memory of them."""
    cache: dict[str, str] = kube_config._temp_files
    for key, path in list(cache.items()):
        if Path(path).parent == scratch:
            del cache[key]
    shutil.rmtree(scratch, ignore_errors=True)


def kubeconfig_base_dir(config: KubernetesProviderConfig) -> Path | None:
    """Where relative paths of a ``file:`` kubeconfig are read from."""
    kind, _, target = config.kubeconfig.ref.partition(":")
    return Path(target).parent if kind == "file" else None


def build_transport(access: ClusterAccess) -> httpx.AsyncHTTPTransport:
    """The TLS transport to B (tests wrap it to inject network faults)."""
    if access.server.startswith("http://"):
        return httpx.AsyncHTTPTransport()
    return httpx.AsyncHTTPTransport(verify=access.ssl_context())
