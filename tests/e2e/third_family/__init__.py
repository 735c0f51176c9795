"""The toy third family of `tests/e2e/test_third_family.py`: its family module and its own validation package (its
image is `images/toy/`). Everything a family with its own image and gate needs lives in these files."""
