"""Model adapters. `get_adapter(spec)` returns the adapter for a model spec."""
