"""Paper experiments: experiment files (TOML) and the scripts that report on their runs."""
