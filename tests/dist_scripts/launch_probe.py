"""Run by ``mtl launch`` (tests/test_documented_keys.py): each rank starts the process group as a job does, sums
its rank + 1 over the group and prints what it sees as one ``PROBE {json}`` line (with ``store_nodelay``: the
``TCP_NODELAY`` option of each of its connections to the store, found independently of mtl.core.runtime).
``PROBE_RANK0_DELAY`` seconds: rank 0 waits that long before it starts the group (so that rank 1 comes first, as it
often does)."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def store_options(port):
    """``TCP_NODELAY`` of each TCP socket of this process whose peer is ``port`` (``ss``-like, from /proc/self/fd)."""
    import socket

    options = []
    for name in os.listdir("/proc/self/fd"):
        try:
            copy = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)  # not a socket
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            try:
                if sock.getpeername()[1] == port:
                    options.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            except OSError:
                pass  # not connected
    return options


def main():
    import paddle
    import paddle.distributed as dist

    from mtl.core.runtime import init_distributed, local_process_count, master_endpoint

    if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":
        time.sleep(float(os.environ.get("PROBE_RANK0_DELAY", "0")))
    rank, world = init_distributed()
    total = paddle.to_tensor(float(rank + 1))
    dist.all_reduce(total)
    print("PROBE " + json.dumps({"rank": rank, "world": world, "local": local_process_count(), "sum": float(total),
                                 "store_nodelay": store_options(master_endpoint()[1]),
                                 "endpoints": os.environ.get("PADDLE_TRAINER_ENDPOINTS", "")}), flush=True)


if __name__ == "__main__":
    main()
