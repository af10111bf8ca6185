"""Built-in platforms: one small module each, imported only when the registry needs it."""
