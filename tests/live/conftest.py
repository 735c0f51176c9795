"""The live suite's confirmation flag: `pytest -m live tests/live --yes` (or `make test-aws-live PYTEST_ARGS=--yes`)."""


def pytest_addoption(parser):
    parser.addoption("--yes", action="store_true", default=False,
                     help="confirm that the live AWS suite may create billed resources (or set SHIPLIFT_LIVE_OK=1)")
