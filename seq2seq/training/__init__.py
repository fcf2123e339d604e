"""The trainer in named steps (trainer.py), its counters (state.py) and its budgets (budget.py),
the way in from a config to a run directory (entry.py), the data a run prepares (prepare.py),
validation, the optimiser and its schedule, torch.compile's rule, and the training curves.
"""
