"""Airflow refresh DAG of configs/releases/qwen35-4b-semif.yaml (schedule from the config; shared wiring in
_shiplift_dags.py)."""

from _shiplift_dags import refresh_dag

dag = refresh_dag("qwen35-4b-semif.yaml")
