"""Ports chosen for later binding lie outside the kernel's ephemeral range and are free."""

from __future__ import annotations

import socket

import pytest

from vk_provider_dev.cluster import ports


def test_the_ephemeral_range_is_read_from_the_kernel_format() -> None:
    assert ports.ephemeral_start("32768\t60999\n") == 32768
    assert ports.ephemeral_start("40000 65000") == 40000


def test_an_unreadable_range_falls_back_to_the_linux_default() -> None:
    assert ports.ephemeral_start("") == ports.DEFAULT_EPHEMERAL_START
    assert ports.ephemeral_start("garbage") == ports.DEFAULT_EPHEMERAL_START


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    chosen = ports.free_ports(20)
    high = ports.ephemeral_start()
    assert len(set(chosen)) == 20
    assert all(ports.LOWEST <= p < high for p in chosen)
    for port in chosen:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_being_listened_on_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "ephemeral_start", lambda text=None: taken + 100)
        chosen = ports.free_ports(5)
    assert taken not in chosen
    assert all(taken < p < taken + 100 for p in chosen)


def test_client_connections_never_get_a_chosen_port() -> None:
    """The race this module exists for: outgoing sockets take ports from the ephemeral range."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        address = server.getsockname()
        clients = []
        try:
            for _ in range(50):
                client = socket.create_connection(address)
                clients.append(client)
            client_ports = {c.getsockname()[1] for c in clients}
        finally:
            for client in clients:
                client.close()
    assert all(p >= ports.ephemeral_start() for p in client_ports)
    assert not client_ports & set(ports.free_ports(50))
