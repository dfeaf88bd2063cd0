"""Experiments on the analytic law: synthetic targets and drafts, convergence (the main job), sweeps, block verification."""
