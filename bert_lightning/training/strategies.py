"""Training strategies our Hydra `trainer` group names beyond Lightning's own."""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy

from bert_lightning.training.lightning_api import set_data_parallel_size


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 (`fully_shard`, applied in the module's `configure_model`) over every process of
    every node: Lightning's ModelParallelStrategy with the whole world as the data-parallel
    mesh and no tensor parallelism. Runs on GPUs and, with gloo, on CPUs (its FSDPStrategy
    refuses CPUs). By default a checkpoint is one file with the full state dict, portable
    like a DDP one."""

    def __init__(self, *, save_distributed_checkpoint: bool, **kwargs):
        kwargs.update(
            tensor_parallel_size=1, save_distributed_checkpoint=save_distributed_checkpoint
        )
        super().__init__(**kwargs)

    def setup_environment(self) -> None:
        set_data_parallel_size(self, self.num_nodes * self.num_processes)
        super().setup_environment()
