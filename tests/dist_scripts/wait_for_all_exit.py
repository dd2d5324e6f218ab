"""Two ranks meet in :func:`mtl.parallel.distributed.wait_for_all`: rank 1 first, rank 0 3 s later, and rank 0 ends
its process the moment the wait returns (as it does after a job's last evaluation). Rank 1 must come out of the wait
too: the key-value store it reads lives in rank 0's process.

Usage: ``python -m paddle.distributed.launch --nproc_per_node 2 wait_for_all_exit.py``; rank 1 prints ``rank 1 went
on``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    """The two ranks' parts."""
    from mtl.core.runtime import init_distributed
    from mtl.parallel import distributed

    rank, _ = init_distributed()
    if rank == 0:
        time.sleep(3.0)
        distributed.wait_for_all("the test's wait")
        os._exit(0)
    distributed.wait_for_all("the test's wait")
    print("rank 1 went on", flush=True)


if __name__ == "__main__":
    main()
