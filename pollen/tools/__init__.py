"""The operator's tools: the `pollen` command line, the local-federation launcher, progress,
reports, experiments, app signing and the checks run before anything starts.

The top layer: nothing below imports it."""
