"""Run records: a run's directory (rundir), its metrics and plots, comparing runs, and studies
over many runs."""
