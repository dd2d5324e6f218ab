"""Head base classes and the pieces the head plug-ins (top-level ``heads/``) share: sharding, margins."""
