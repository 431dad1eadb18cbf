"""Reference model runners in plain PyTorch (CPU or GPU): exact, short, readable."""
