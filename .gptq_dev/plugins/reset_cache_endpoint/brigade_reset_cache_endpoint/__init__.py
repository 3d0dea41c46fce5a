"""brigade-reset-cache-endpoint: an admin route that empties the engine's prefix cache."""
