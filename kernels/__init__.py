"""Fast kernels for the agentrl hot paths, each behind one public op with a jnp reference."""
