"""Airflow sweep DAG of configs/sweeps/gemma-decision-quant.yaml (shared wiring in _shiplift_sweeps.py)."""

from _shiplift_sweeps import sweep_dag

dag = sweep_dag("gemma-decision-quant.yaml")
