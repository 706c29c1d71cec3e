"""The FlinkApp spec: models (pure) and the YAML loader."""
