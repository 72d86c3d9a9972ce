"""Tensor parallelism: the communicator the ranks share, and the graph ops that use it.

- `comm.py`: `Communicator`, torch.distributed for one group of ranks: AllReduce / AllGather of
  activations (NCCL on cuda, gloo on cpu) and a gloo control channel rank 0 drives the others by.
- `steps.py`: the plan's step functions for the tensor-parallel graph ops (AllReduce, AllGather,
  LocalIds, MaskRows), shared by every backend.
- `launch.py`: this process's place in the group (torchrun's environment, or ranks minfer starts
  itself), and starting the other ranks.

How a model is split lives with the model (models/llama.py `partition`, `tensor_slices`) and
the file view (gguf/shard.py); how rank 0 drives the others lives in engine/tp.py.
"""
