"""Rank 0's store, as the other ranks find it and wait for it (mtl.core.runtime.master_endpoint, wait_for_master): the
endpoint in the order ``paddle.distributed.init_parallel_env`` reads it, and a wait that ends at the first
connection a listening socket accepts, or after its timeout when nobody listens. The launch that shows the 3 s retry
gone, and each rank's store connection with TCP_NODELAY:
tests/test_documented_keys.py::test_mtl_launch_with_ips_starts_one_group_of_the_listed_nodes."""
import os
import socket

from mtl.core.runtime import master_endpoint, store_without_delay, wait_for_master
from tests.dist_util import free_port


def test_the_endpoint_is_read_in_paddles_order():
    both = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6170", "PADDLE_MASTER": "10.0.0.2:6171",
            "PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:6172,10.0.0.4:6173"}
    assert master_endpoint(both) == ("10.0.0.1", 6170)
    assert master_endpoint({k: v for k, v in both.items() if k != "MASTER_PORT"}) == ("10.0.0.2", 6171)
    assert master_endpoint({"PADDLE_TRAINER_ENDPOINTS": both["PADDLE_TRAINER_ENDPOINTS"]}) == ("10.0.0.3", 6172)
    assert master_endpoint({}) is None


def test_the_wait_ends_when_the_store_listens(monkeypatch):
    """Nobody listens at the first probe; the store opens during the sleep after it, and the next probe ends the
    wait (Paddle's client would sleep 3 s there)."""
    import time

    port, server, sleeps = free_port(), socket.socket(), []
    real_sleep = time.sleep

    def sleep_and_open(seconds):
        if not sleeps:
            server.bind(("127.0.0.1", port))
            server.listen()
        sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep_and_open)
    try:
        assert wait_for_master(("127.0.0.1", port), timeout=60, interval=0.01) == 1
        assert sleeps == [0.01]
        assert wait_for_master(("127.0.0.1", port), timeout=60, interval=0.01) == 0  # listening: at once
    finally:
        server.close()


def test_the_wait_gives_up_after_its_timeout_when_nobody_listens():
    failed = wait_for_master(("127.0.0.1", free_port()), timeout=0.2, interval=0.01)
    assert failed >= 2


def test_only_the_connections_to_the_store_send_at_once():
    """store_without_delay sets TCP_NODELAY on this process's connections whose peer is the store's port (both of
    them here) and on no other socket: another connection, the listening sockets, a pipe, a Unix socket pair (whose
    peer name is no address), a connected UDP socket to the same port."""
    store, other = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    port = store.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    unrelated = socket.create_connection(other.getsockname())
    served = [store.accept()[0] for _ in clients] + [other.accept()[0]]
    read, write = os.pipe()
    pair = socket.socketpair()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.connect(("127.0.0.1", port))
    try:
        def nodelay(sock):
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

        assert [nodelay(c) for c in clients + [unrelated]] == [0, 0, 0]
        assert store_without_delay(("127.0.0.1", port)) == 2
        assert [nodelay(c) for c in clients] == [1, 1]
        assert nodelay(unrelated) == 0 and [nodelay(s) for s in served] == [0, 0, 0]
        assert store_without_delay(("127.0.0.1", free_port())) == 0
    finally:
        for sock in clients + served + [unrelated, store, other, *pair, udp]:
            sock.close()
        os.close(read)
        os.close(write)


def test_an_ipv6_connection_to_the_store_is_found_too():
    """The store reached over IPv6 (a host given as ::1): its port is the second item of the peer name as well."""
    import pytest

    try:
        store = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    port = store.getsockname()[1]
    client = socket.create_connection(("::1", port))
    served = store.accept()[0]
    try:
        assert store_without_delay(("::1", port)) == 1
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        for sock in (client, served, store):
            sock.close()
