"""Model architectures; each is registered by name through the register_models hook."""
