"""Rank RANK of a 2-rank gloo Communicator with a 1 s data timeout (tests/parallel/test_tp_gloo.py):
rank 0 sends its first command after 3 s of silence; the follower must still get it; then an
uneven AllGather and an AllReduce. Prints what it got.

    python comm_pair.py RANK PORT
"""

import sys
import time

import torch

from minfer.parallel.comm import Communicator

rank, port = int(sys.argv[1]), int(sys.argv[2])
comm = Communicator(rank, 2, port=port, timeout_s=1)
if rank == 0:
    time.sleep(3)  # longer than the data timeout: the control channel has none to speak of
got = comm.broadcast(("forward", [1, 2, 3]) if rank == 0 else None)
x = torch.arange(6, dtype=torch.float32).view(2, 3)[:, : 3 - rank] + 10 * rank  # widths 3 and 2
gathered = comm.all_gather(x.contiguous(), (3, 2))
summed = comm.all_reduce(torch.ones(4, dtype=torch.bfloat16) * (rank + 1))
print(rank, got, gathered.tolist(), summed.dtype, summed.tolist(), comm.min_int(5 - rank), flush=True)
comm.close()
