"""The plugin protocol compiles and covers every method of the provider contract."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

from grpc_tools import protoc

from vk_provider.domain.contract import Provider

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PROTO = PROTO_ROOT / "vkprovider" / "v1" / "provider.proto"


def test_the_protocol_compiles(tmp_path: Path) -> None:
    includes = str(importlib.resources.files("grpc_tools") / "_proto")
    code = protoc.main(
        ["protoc", f"-I{PROTO_ROOT}", f"-I{includes}", f"--python_out={tmp_path}", str(PROTO)]
    )
    assert code == 0
    assert (tmp_path / "vkprovider" / "v1" / "provider_pb2.py").exists()


def test_every_contract_method_has_an_rpc() -> None:
    rpcs = {name.lower() for name in re.findall(r"rpc (\w+)\(", PROTO.read_text())}
    methods = {"offers", "create", "get", "delete", "list_ours", "logs"}
    assert {m.replace("_", "") for m in methods} <= rpcs
    assert all(hasattr(Provider, m) for m in methods)
