"""The engine: EngineCore (the busy loop), its clients, and the front end's output processing."""
