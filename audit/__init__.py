"""audit: see docs/architecture.md (not built yet)."""
