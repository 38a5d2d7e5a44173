"""The plugin protocol: the committed generated code matches the proto, and every method of
the provider contract has an RPC that the server kit serves and the client calls."""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

from vk_provider.domain.contract import Provider
from vk_provider_adapters.plugin import client, rpc, server

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "vkprovider" / "v1" / "provider.proto"
GENERATED = ROOT / "providers" / "vk_provider_adapters" / "plugin" / "_gen"


def test_the_committed_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(tmp_path)], check=True, timeout=120)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2.py*"))
    committed = sorted(p.relative_to(GENERATED) for p in GENERATED.rglob("*_pb2.py*"))
    assert fresh == committed
    for relative in fresh:
        assert (tmp_path / relative).read_text() == (GENERATED / relative).read_text(), (
            f"{relative} differs from proto/: run scripts/gen-proto and commit the result"
        )


def test_every_contract_method_has_an_rpc() -> None:
    rpcs = {name.lower() for name in re.findall(r"rpc (\w+)\(", PROTO.read_text())}
    assert {name.lower() for name in rpc.METHODS} == rpcs
    methods = {"offers", "create", "get", "delete", "list_ours", "logs"}
    methods |= {"usage", "restart_container"}
    assert {m.replace("_", "") for m in methods} <= rpcs
    assert all(hasattr(Provider, m) for m in methods - {"usage", "restart_container"})


def test_the_client_calls_every_rpc_and_the_server_serves_every_one() -> None:
    called = set(re.findall(r'"(\w+)"', inspect.getsource(client)))
    assert called >= rpc.METHODS
    served = set(re.findall(r'"(\w+)": ', inspect.getsource(server)))
    assert served >= rpc.METHODS
