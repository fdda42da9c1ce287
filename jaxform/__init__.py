"""jaxform: a user-malleable compiler layer over JAX."""
