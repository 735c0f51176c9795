"""The entry points people run: the `shiplift` command (`main`) and the local release demo (`demo`)."""
