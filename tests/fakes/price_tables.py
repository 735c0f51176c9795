"""Price tables for tests, written out so the hand-worked cases do not move when the shipped table is updated."""

PRICE_TABLE_HEAD = """\
version: 1
offer: sagemaker-real-time-on-demand
currency: USD
unit: instance-hour
prices:
  us-east-1:
"""


def price_table(*entries: str) -> str:
    """A us-east-1 price file with one `ml.x: {usd_per_hour: …}` line per entry."""
    return PRICE_TABLE_HEAD + "".join(f"    {entry}\n" for entry in entries)
