"""Errors raised for bad data settings, so callers can report them without a traceback."""

from __future__ import annotations


class DataConfigError(ValueError):
    """A data setting (dataset, partitioner, fraction, client id, cache) cannot be used."""


class DatasetNotFoundError(DataConfigError):
    """A dataset's files are not on this machine and downloading was not allowed."""
