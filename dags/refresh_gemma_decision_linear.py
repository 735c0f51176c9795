"""Airflow refresh DAG of configs/releases/gemma-decision-linear.yaml (schedule from the config; shared wiring in
_shiplift_dags.py)."""

from _shiplift_dags import refresh_dag

dag = refresh_dag("gemma-decision-linear.yaml")
