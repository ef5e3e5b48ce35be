"""The turn runtime: leases, the turn loop, dispatch to workers and the sweep."""
