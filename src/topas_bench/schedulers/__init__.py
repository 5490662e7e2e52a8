"""Scheduling policies: the interface, the shared estimator, and the registered schedulers."""
