"""A run's parts, made once from its settings: data, model, optimizer, step engine and the rest."""
