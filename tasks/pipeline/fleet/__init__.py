"""The fleet: models that share one production endpoint (docs/fleet.md).

layout.py names a layout (the id a shared endpoint and its components carry); snapshot.py reads what a fleet command
needs once (the configs, each model's ledger history, the copies its component serves now); plan.py is the plan, a
pure function of a snapshot; pack.py chooses the cheapest MIG layout for a portfolio; move.py moves every model onto
a new layout's endpoint, records each move and retires the old endpoint. The CLI (`tasks/cli/fleet_commands.py`)
renders their results. This module imports nothing, so the stages may import the layout's naming without importing the
rest of the fleet.
"""
