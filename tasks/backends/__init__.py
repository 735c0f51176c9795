"""The backends behind the seams (`interfaces`): `local/` and `aws/` side by side, chosen in `registry`."""
