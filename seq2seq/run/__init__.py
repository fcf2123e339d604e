"""A run directory and the machine it runs on: checkpoints and safe saving, the device, threads
and ranks, the precision, and what a run writes about itself (environment, metrics).
"""
