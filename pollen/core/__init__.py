"""What every layer above shares: run settings, the algorithm registry, the message protocol,
each algorithm's contract, the data specification, paths and the results-directory format.

Nothing here imports the apps, the algorithm halves or the operator tools."""
