"""Model execution: layers, model definitions and the loader that builds a model and fills its weights."""
