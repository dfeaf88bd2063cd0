"""Experiments on the analytic law: synthetic targets and drafts, rounds of verification, sweeps, block verification (the main job, convergence, is experiments.convergence)."""
