"""ElasticSampler: horovod.torch.elastic's sampler, which splits an epoch's samples among the
ranks and, after a reset, splits the samples not yet processed among the new world."""

import math
import random

import torch.utils.data

from kolo.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset among the ranks, and repartitions the rest of the epoch after a
    reset, so that every sample of an epoch is processed once across changes of the world.

    Use it as Horovod's: keep it in the TorchState, call record_batch(batch_idx, batch_size)
    after each batch and set_epoch(epoch + 1) at the end of an epoch (not the start: a reset in
    the middle of an epoch must not forget what was processed).

    How it tracks progress: the epoch's order (shuffled by seed + epoch, the same on every rank)
    is dealt round-robin, rank r taking positions r, r + n, r + 2n, ... of the samples left. Ranks
    step in lockstep, so after every rank processed k samples, the processed ones are exactly the
    first k*n positions, and one number (processed_num, what state_dict holds) says what is left.

    Padding: when the samples left do not divide by the world size, the last positions are
    filled with repeats, as Horovod and DistributedSampler do, so that every rank gets the same
    number of samples and batches (ranks whose training step runs collectives must step
    together). Padding comes last (at most one sample per rank, in the epoch's last batch), and is
    never counted as processed: processed_num stops at the dataset's length, so a reset neither
    skips nor repeats a real sample because of it. Code that must see every sample exactly once
    (evaluation, or a log of processed samples) drops this rank's positions from
    num_real_samples on: those are the repeats.

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle every epoch (default).
        seed: the shuffle's seed, the same on every rank.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.num_real_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: a new order, nothing processed. Call it when an epoch ends."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed one more batch of batch_size samples."""
        self.processed_num = min(self.processed_num + batch_size * self.num_replicas,
                                 len(self.dataset))

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Splits the samples not yet processed this epoch among the current world."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        left = len(self.remaining_indices)
        self.num_samples = int(math.ceil(left / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        # Positions self.rank, self.rank + n, ... below `left` are real samples.
        self.num_real_samples = max(0, int(math.ceil((left - self.rank) / self.num_replicas)))

    def __iter__(self):
        left = self.remaining_indices
        padded = list(left)
        while left and len(padded) < self.total_size:  # fewer samples than ranks: repeat again
            padded += left[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        assert len(self.indices) == self.num_samples
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
