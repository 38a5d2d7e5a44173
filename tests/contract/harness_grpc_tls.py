"""Contract harness: the local adapter over gRPC on TCP 127.0.0.1 with TLS and client certs."""

from __future__ import annotations

from tests.contract.harness_grpc import GrpcTLSHarness

HARNESS = GrpcTLSHarness()
