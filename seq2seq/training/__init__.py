"""The trainer in named steps (trainer.py), the data a run prepares (prepare.py), validation,
the optimiser and its schedule, torch.compile's rule, and the training curves.
"""
