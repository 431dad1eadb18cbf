"""The model description both runner families share: typed config, checkpoint formats."""
