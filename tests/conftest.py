"""Shared test setup: one torch thread.

The models in tests are tiny, so a second thread buys nothing, and on a 2-core machine
shared with other work OpenMP threads that spin-wait for each other slow every op down
many times over.
"""

import torch

torch.set_num_threads(1)
