"""Airflow DAG: triggered promotion or rollback of a release, with params validated before any task runs."""

from _shiplift_dags import promote_release_dag

dag = promote_release_dag()
