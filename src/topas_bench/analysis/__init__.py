"""Metrics, tables, figures and reports over result files."""
