"""What two halves that never import each other agree on: record keys, message layouts, names."""
