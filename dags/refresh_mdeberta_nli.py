"""Airflow refresh DAG of configs/releases/mdeberta-nli.yaml (schedule from the config; shared wiring in
_shiplift_dags.py)."""

from _shiplift_dags import refresh_dag

dag = refresh_dag("mdeberta-nli.yaml")
