"""A small DistributedOptimizer job for the autotuner tests: argv[1] steps of a linear model, after
which every rank checks that the ranks' parameters are identical (settings switched mid-run must
not change the results)."""

import sys

import torch

import kolo.torch as hvd

hvd.init()
torch.manual_seed(0)
steps = int(sys.argv[1])
model = torch.nn.Linear(64, 8)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(16, 64)
for _ in range(steps):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
w = hvd.allgather(model.weight.detach().reshape(1, -1))
assert torch.equal(w[0], w[-1]), "ranks' parameters differ"
print("ok autotune worker rank %d" % hvd.rank())
hvd.shutdown()
