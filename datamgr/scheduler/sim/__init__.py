"""The trace-driven simulator: the same policy objects as the live controller, on a modelled cluster."""
