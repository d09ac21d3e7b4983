"""Job scripts shipped to the cluster (run there with the cluster venv, not imported here)."""
