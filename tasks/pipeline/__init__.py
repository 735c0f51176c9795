"""The release pipeline: the one stage table, the stages, and the runs built on them (release, promotion, bake)."""
