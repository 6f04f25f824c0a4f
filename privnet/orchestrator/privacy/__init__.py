"""How private a run was: the accountant (epsilon from the run's own trajectories), the
empirical audit of that claim (`privnet dp-audit`) and the float-Laplace leakage test."""
