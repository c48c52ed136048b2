"""agentrl: JAX-native RL post-training of language-model policies and agents."""

__version__ = "0.1.0"
