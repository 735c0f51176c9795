"""Candidate sweeps (issue 48): one base release config, the axes to vary, a rule written before the results."""
