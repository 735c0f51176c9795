"""Orchestrators that run the stage table outside the CLI (Step Functions; Airflow's wiring lives in dags/)."""
