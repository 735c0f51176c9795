"""Airflow DAG, hourly audit: verify the ledger chain and compare what the endpoints serve with the ledger."""

from _shiplift_dags import audit_ledger_dag

dag = audit_ledger_dag()
